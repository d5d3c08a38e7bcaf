"""The model runner: one ONNX Runtime session over a decoder exported by the
onnxruntime-genai builder, and a KV cache shared by all running sequences.

The KV cache is one buffer per layer, ``[slots, kv_heads, capacity, head_size]``. Running
sequences occupy rows ``0..n-1`` (kept compact: a retired row is replaced by the last one),
so a decode step is a single batched call on a contiguous view. Prefill writes a new
sequence's keys straight into its row. GroupQueryAttention reads each row's own length
from the attention mask, so rows of different lengths share one step — continuous batching.
The runner holds tensors, never queues: the scheduler decides who runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortserve.engine.graph import LOGIT_ROWS, gather_positions, load_decoder, native_edits
from ortserve.engine.huge_pages import anon_mappings, hand_native_weights, use_huge_pages
from ortserve.engine.kvcache import DeviceKV, HostKV, device_of
from ortserve.engine.lora import Adapter, LoraInputs, add_lora, find_targets, split_key
from ortserve.engine.runtime import register_custom_ops, session_library
from ortserve.engine.spec import ModelSpec
from ortserve.errors import ModelError

__all__ = ["DecodeIO", "ModelSpec", "Runner"]  # ModelSpec: importers take it from here

log = logging.getLogger("ortserve.engine")

_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass
class DecodeIO:
    """A cached decode binding and the buffers its input ids, logit rows, positions and logits
    output stay bound to."""

    io: Any
    key: tuple[Any, ...]
    ids: np.ndarray
    picks: np.ndarray
    out: np.ndarray
    positions: np.ndarray | None


class Runner:
    """Batched prefill/decode over an ONNX Runtime session with a shared KV cache."""

    def __init__(self, spec: ModelSpec, *, slots: int = 16, capacity: int = 256,
                 providers: list[Any] | None = None, session_options: Any = None,
                 kv_placement: str = "auto", last_logits_only: bool = True, huge_pages: bool = True,
                 lora: bool = False, lora_mode: str = "mask") -> None:
        """``kv_placement``: ``host`` (numpy), ``device`` (OrtValues on the provider's device) or
        ``auto`` (host for the CPU provider, device for the others). ``huge_pages``: put the CPU
        provider's prepacked weights, and the blocks the GGUF-native ops read, in transparent huge
        pages (engine/huge_pages.py); ``session_options`` then belongs to this Runner.
        ``lora``: add the batched LoRA term (engine/lora.py), ``lora_mode`` ``mask`` or ``gather``;
        adapters come with ``set_adapters``."""
        import onnxruntime as ort

        self.spec = spec
        self.slots = slots
        providers = providers or ["CPUExecutionProvider"]
        # logits for the positions asked for only (engine/graph.py): the last one of each row, and
        # every fed one of a speculating row; prefill memory and LM-head work do not grow with the prompt
        model: str | bytes = str(spec.onnx_path)
        proto = load_decoder(spec.onnx_path) if last_logits_only or lora else None
        sliced = proto is not None and last_logits_only and gather_positions(proto)
        if proto is not None and last_logits_only and not sliced:
            log.warning("no LM head found before 'logits' in %s: prefill keeps all positions", spec.onnx_path)
        self.lora_targets = []
        if lora:
            if proto is None:
                raise ModelError("LoRA adapters need the onnx package (pip install onnx)")
            kv = next(i for i in proto.graph.input if i.name == "past_key_values.0.key")
            self.lora_targets = find_targets(proto.graph, q_width=spec.heads * spec.head_size,
                                             kv_width=spec.kv_heads * spec.head_size)
            if not self.lora_targets:
                raise ModelError(f"{spec.onnx_path} has no projection the LoRA edit recognizes")
            self.lora_dtype = np.float16 if kv.type.tensor_type.elem_type == 10 else np.float32
            add_lora(proto, self.lora_targets, self.lora_dtype, lora_mode)
        self.lora_mode = lora_mode
        # the native kernels' own nodes (engine/graph.py), after LoRA's edit: a down_proj term reads
        # the SwiGLU product and that layer keeps it
        self.native_edits = native_edits(proto, session_library(spec.onnx_path.parent)) if proto is not None else {}
        edited = bytes(proto.SerializeToString()) if sliced or lora or any(self.native_edits.values()) else None
        session_options = register_custom_ops(session_options or ort.SessionOptions(), spec.onnx_path.parent)
        if edited is not None:
            model = edited
            session_options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                                     str(spec.onnx_path.parent))
        self.last_logits_only = bool(sliced)
        huge_pages = huge_pages and device_of(providers[0]) == "cpu"
        # the GGUF-native ops read the file's blocks in place: into huge pages first, then handed
        # to the session as initializers it does not copy (engine/huge_pages.py)
        self._native_weights = None
        if huge_pages and spec.session_options.get("custom_ops_library"):
            graph = proto if proto is not None else load_decoder(spec.onnx_path)
            try:
                self._native_weights = hand_native_weights(session_options, graph, spec.onnx_path.parent)
            except OSError as exc:
                raise ModelError(f"cannot load {spec.onnx_path}: {exc}",
                                 hint="the model file may be corrupt; `ortserve models verify` checks it") from exc
        before = anon_mappings() if huge_pages else set()
        try:
            self.session = ort.InferenceSession(model, session_options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelError(f"cannot load {spec.onnx_path}: {str(exc).splitlines()[0]}",
                             hint="the model file may be corrupt; `ortserve models verify` checks it") from exc
        # the weights were just prepacked into fresh 4 KB pages: a decode step reads them all
        self.huge_page_bytes = (use_huge_pages(before) if huge_pages else 0) + \
            (self._native_weights.nbytes if self._native_weights else 0)
        inputs = {i.name: i for i in self.session.get_inputs()}
        # a decoder fed token ids, or one fed inputs_embeds (engine/embeds_runner.py feeds those)
        if not inputs.keys() & {"input_ids", "inputs_embeds"} or "past_key_values.0.key" not in inputs:
            raise ModelError(f"{spec.onnx_path} is not a decoder with a KV cache (inputs: {list(inputs)})")
        self.dtype = _NP.get(inputs["past_key_values.0.key"].type, np.float32)
        self.ids_dtype = np.int64 if inputs.get("input_ids", inputs["attention_mask"]).type == "tensor(int64)" else np.int32
        self.mask_dtype = np.int64 if inputs["attention_mask"].type == "tensor(int64)" else np.int32
        self.has_position_ids = "position_ids" in inputs
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        vocab = logits.shape[-1] if isinstance(logits.shape[-1], int) else spec.vocab_size
        self._logits = np.zeros((1, slots, vocab), dtype=_NP.get(logits.type, np.float32))
        self.lengths = np.zeros(slots, dtype=np.int64)  # tokens held in each row
        self.capacity = 0
        self.rows = 0
        device = device_of(providers[0])
        if kv_placement == "device" or (kv_placement == "auto" and device != "cpu"):
            self.kv: HostKV | DeviceKV = DeviceKV(2 * spec.layers, self.dtype, device, providers)
        else:
            self.kv = HostKV(2 * spec.layers, self.dtype)
        self._bindings: dict[tuple[Any, ...], Any] = {}  # IOBindings, and DecodeIOs under decode keys
        self.adapters: dict[str, int] = {"": 0}  # adapter name -> its index in the stacks (0: the base)
        self.row_adapter = np.zeros(slots, dtype=np.int64)  # each row's adapter index
        self.row_scale = np.ones(slots, dtype=np.float64)  # and its per-request scale multiplier
        self._lora: LoraInputs | None = None
        self._staged: tuple[list[Adapter], LoraInputs | None] | None = None  # a new set, for the loop thread
        if lora:
            self.set_adapters([])
        # bytes one token takes in one row, keys and values of every layer
        self.bytes_per_token = 2 * spec.layers * spec.kv_heads * spec.head_size * np.dtype(self.dtype).itemsize
        self.byte_limit = 1 << 62  # the KV budget: growth stops short of it (the scheduler keeps within)
        self._grow(max(16, capacity), 1)

    # ---- cache management -------------------------------------------------
    def _grow(self, capacity: int, rows: int) -> None:
        """Reallocate the cache as ``rows`` x ``capacity`` tokens, keeping what it holds.

        Both grow on demand (rows up to ``slots``, capacity up to the context), so one long
        request costs one row of KV, not ``slots`` rows.
        """
        capacity = min(capacity, self.spec.context_length)
        rows = min(max(rows, 1), self.slots)
        shape = (rows, self.spec.kv_heads, capacity, self.spec.head_size)
        self.kv.allocate(shape, min(rows, self.rows), min(capacity, self.capacity))
        self.capacity = capacity
        self.rows = rows
        self._bindings = {}  # they point at the old buffers
        self._ones = np.ones(capacity, dtype=self.mask_dtype)  # a one-row decode step's mask
        self._arange = np.arange(capacity)

    @property
    def nbytes(self) -> int:
        return self.rows * self.capacity * self.bytes_per_token

    def ensure_capacity(self, tokens: int) -> None:
        """Room for ``tokens`` per row: doubling (amortized copies) but not past the byte limit."""
        if tokens > self.capacity:
            room = self.byte_limit // (self.rows * self.bytes_per_token)
            self._grow(max(tokens, min(2 * self.capacity, self.spec.context_length, room)), self.rows)

    def ensure_rows(self, rows: int) -> None:
        """Room for ``rows`` rows: doubling, but not past the byte limit (capacity gives way to
        rows, down to what the rows in use hold)."""
        if rows <= self.rows:
            return
        rows = min(max(rows, min(2 * self.rows, self.byte_limit // (self.capacity * self.bytes_per_token))),
                   self.slots)
        capacity = self.capacity
        if rows * capacity * self.bytes_per_token > self.byte_limit:
            used = int(self.lengths.max()) + 1
            capacity = max(used, self.byte_limit // (rows * self.bytes_per_token))
        self._grow(capacity, rows)

    def move(self, src: int, dst: int) -> None:
        """Copy row ``src`` into row ``dst`` (compaction when a sequence retires)."""
        n = int(self.lengths[src])
        self.kv.move_row(src, dst, n)
        self.row_adapter[dst], self.row_scale[dst] = self.row_adapter[src], self.row_scale[src]
        self.lengths[dst] = n
        self.lengths[src] = 0

    def clear(self, row: int) -> None:
        self.lengths[row] = 0

    # ---- LoRA adapters (engine/lora.py) -------------------------------------
    def set_adapters(self, adapters: list[Adapter], inputs: LoraInputs | None = None) -> None:
        """Serve exactly ``adapters`` from now on (their stacks: ``inputs`` when built beforehand by
        ``lora_inputs``; no new session). Call it between steps; running rows keep their adapters."""
        if not self.lora_targets:
            raise ModelError("this runner was loaded without LoRA support (Runner(lora=True))")
        self._lora = inputs or self.lora_inputs(adapters)
        names = {i: name for name, i in self.adapters.items()}  # rows keep their adapter across the change
        self.adapters = {"": 0} | {a.name: i for i, a in enumerate(adapters, start=1)}
        self.row_adapter[:] = [self.adapters.get(names.get(int(i), ""), 0) for i in self.row_adapter]
        self._staged, self._bindings = None, {}

    def lora_inputs(self, adapters: list[Adapter]) -> LoraInputs:
        """The stacks of ``adapters`` (numpy work: any thread, while the loop runs)."""
        return LoraInputs(self.lora_targets, adapters, self.lora_dtype, self.lora_mode)

    def stage_adapters(self, adapters: list[Adapter], inputs: LoraInputs | None = None) -> None:
        """From another thread: ``adapters`` become the set at the next admission (running rows keep
        their adapters: set_adapters re-marks them)."""
        self._staged = (list(adapters), inputs)

    def use_adapter(self, row: int, adapter: str) -> None:
        """Run ``row`` with ``adapter``, a key of engine/lora.py ``adapter_key`` ("" for the base, or an
        adapter's name with its per-request scale); KeyError when it is not loaded."""
        if self._staged is not None:
            staged, self._staged = self._staged, None
            self.set_adapters(*staged)
        name, scale = split_key(adapter)
        if name and not self.lora_targets:
            raise KeyError(adapter)
        self.row_adapter[row], self.row_scale[row] = self.adapters[name], scale

    # ---- prefix reuse (engine/prefix_cache.py) ------------------------------
    def save(self, row: int) -> Any:
        """A copy of the KV ``row`` holds, sized to its tokens, to start later sequences from."""
        return self.kv.save(row, int(self.lengths[row]))

    def load(self, row: int, block: Any, tokens: int, *, total: int) -> None:
        """Start ``row`` with the first ``tokens`` of a saved ``block`` (its prefix is ``total`` long)."""
        self.ensure_rows(row + 1)
        self.ensure_capacity(max(total, tokens) + 1)
        self.kv.load(block, row, tokens)
        self.lengths[row] = tokens

    def copy_prefix(self, src: int, dst: int, tokens: int, *, total: int) -> None:
        """Start ``dst`` with the first ``tokens`` of running row ``src``, which keeps its own."""
        self.ensure_rows(dst + 1)
        self.ensure_capacity(max(total, tokens) + 1)
        self.kv.move_row(src, dst, tokens)
        self.lengths[dst] = tokens

    # ---- compute ------------------------------------------------------------
    def _binding(self, rows: slice) -> Any:
        """An IOBinding with the KV views of ``rows`` bound as both past and present.

        Cached per (rows, capacity): between steps only input_ids and the mask change, so a
        step rebinds those instead of 4 x layers tensors.
        """
        key = (rows.start, rows.stop, self.capacity)
        io = self._bindings.get(key)
        if io is None:
            io = self._bindings[key] = self._bind_kv(rows, key)
        return io

    def _bind_kv(self, rows: slice, key: tuple[Any, ...]) -> Any:
        io = self.session.io_binding()
        shape = (rows.stop - rows.start, *self.kv.shape[1:])
        where = self.kv.device
        for layer in range(self.spec.layers):
            for j, kind in enumerate(("key", "value")):
                ptr = self.kv.pointer(2 * layer + j, rows.start)
                io.bind_input(f"past_key_values.{layer}.{kind}", where, 0, self.dtype, shape, ptr)
                io.bind_output(f"present.{layer}.{kind}", where, 0, self.dtype, shape, ptr)
        if self._lora is not None:
            self._lora.bound[key] = None  # a fresh binding holds no adapter weights yet
        if len(self._bindings) > 4 * self.slots:
            self._bindings.clear()
        return io

    def _decode_io(self, rows: slice) -> DecodeIO:
        """The binding of a decode step over ``rows`` (cached per rows and capacity, apart from the
        prefill's): input ids, logit rows, position ids and the logits output are bound once, to
        buffers kept with it, so a step writes its tokens in place and rebinds only the mask."""
        key = (rows.start, rows.stop, self.capacity, "decode")
        step = self._bindings.get(key)
        if step is None:
            n = rows.stop - rows.start
            step = DecodeIO(self._bind_kv(rows, key), key, np.zeros((n, 1), self.ids_dtype),
                            np.arange(n, dtype=np.int64), self._logits[:, :n],
                            np.zeros((n, 1), self.ids_dtype) if self.has_position_ids else None)
            for name, buf in (("input_ids", step.ids), (LOGIT_ROWS, step.picks), ("position_ids", step.positions)):
                if buf is not None:
                    step.io.bind_input(name, "cpu", 0, buf.dtype, buf.shape, buf.ctypes.data)
            step.io.bind_output("logits", "cpu", 0, step.out.dtype, step.out.shape, step.out.ctypes.data)
            self._bindings[key] = step
        return step

    def _run(self, rows: slice, input_ids: np.ndarray, mask: np.ndarray, picks: np.ndarray,
             out: np.ndarray | None = None, positions: np.ndarray | None = None) -> np.ndarray:
        """One step; returns the logits [len(picks), vocab] of the flat input positions ``picks``
        (row b, position t is ``b * T + t``)."""
        io = self._binding(rows)
        io.bind_cpu_input("input_ids", input_ids.astype(self.ids_dtype, copy=False))
        io.bind_cpu_input("attention_mask", mask.astype(self.mask_dtype, copy=False))
        held = self._lora.bind(io, (rows.start, rows.stop, self.capacity),  # noqa: F841 - bound arrays live until the run
                               self.row_adapter[rows], self.row_scale[rows]) if self._lora is not None else None
        if self.has_position_ids:
            if positions is None:
                positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, -input_ids.shape[1]:]
            io.bind_cpu_input("position_ids", positions.astype(self.ids_dtype))
        return self._run_bound(io, picks, out)

    def _run_bound(self, io: Any, picks: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """Run ``io`` (its inputs bound) and return the logits of the flat positions ``picks``;
        ``_run`` and engine/embeds_runner.py's ``_run_embeds`` share it."""
        if not self.last_logits_only:  # the graph as exported: every position's logits
            io.bind_output("logits", "cpu")
            self.session.run_with_iobinding(io)
            full = io.get_outputs()[-1].numpy()
            return full.reshape(-1, full.shape[-1])[picks]
        io.bind_cpu_input(LOGIT_ROWS, picks.astype(np.int64, copy=False))
        if out is not None:  # decode: logits land in a preallocated buffer, no per-step wrapping
            io.bind_output("logits", "cpu", 0, out.dtype, out.shape, out.ctypes.data)
            self.session.run_with_iobinding(io)
            return out[0]
        io.bind_output("logits", "cpu")
        self.session.run_with_iobinding(io)
        return io.get_outputs()[-1].numpy()[0]

    def prefill(self, row: int, ids: list[int], *, start: int = 0, total: int | None = None) -> np.ndarray:
        """Run prompt tokens ``ids`` into ``row`` after the ``start`` tokens it already holds (a chunk
        of a ``total``-token prefix); returns the last position's logits [vocab]."""
        n = len(ids)
        self.ensure_rows(row + 1)
        self.ensure_capacity(max(total or 0, start + n) + 1)
        x = np.asarray([ids])
        mask = np.ones((1, start + n), dtype=self.mask_dtype)
        logits = self._run(slice(row, row + 1), x, mask, np.asarray([n - 1]))
        self.lengths[row] = start + n
        return logits[-1].astype(np.float32, copy=False)

    def decode(self, tokens: np.ndarray, start: int = 0) -> np.ndarray:
        """One token for each of rows start..start+n-1 (n = len(tokens)); returns logits [n, vocab]."""
        n = len(tokens)
        lengths = self.lengths[start:start + n]
        total = int(lengths.max()) + 1
        self.ensure_capacity(total)
        rows = slice(start, start + n)
        if n == 1:  # its mask is all ones: a view of a kept buffer, nothing computed
            mask = self._ones[:total].reshape(1, total)
        else:
            mask = (self._arange[:total][None, :] <= lengths[:, None]).astype(self.mask_dtype)
        if not self.last_logits_only:  # the graph as exported (every position's logits): the general path
            logits = self._run(rows, tokens.reshape(n, 1), mask, np.arange(n), self._logits[:, :n])
        else:
            step = self._decode_io(rows)
            step.ids[:, 0] = tokens
            if step.positions is not None:
                step.positions[:, 0] = lengths  # the new token's position: the tokens before it
            step.io.bind_cpu_input("attention_mask", mask)
            held = self._lora.bind(step.io, step.key, self.row_adapter[rows],  # noqa: F841 - live until the run
                                   self.row_scale[rows]) if self._lora is not None else None
            self.session.run_with_iobinding(step.io)
            logits = step.out[0]
        lengths += 1
        return logits.astype(np.float32, copy=False)

    def verify(self, fed: list[list[int]]) -> list[np.ndarray]:
        """Several tokens for each of rows 0..n-1 in one step (speculation, engine/speculation/speculate.py): row b
        is fed ``fed[b]`` (its pending token, then its guesses); returns each row's logits
        [len(fed[b]), vocab], one per fed token. Rows are padded to the longest (the padding's KV
        lands past the row's length and is never read). The rows' lengths are left as they were:
        the caller sets each to what it accepted (``keep``), so a rejected guess leaves no KV behind."""
        n, width = len(fed), max(len(f) for f in fed)
        lengths = self.lengths[:n]
        total = int(lengths.max()) + width
        self.ensure_capacity(total)
        ids = np.asarray([f + [f[-1]] * (width - len(f)) for f in fed])
        mask = (np.arange(total)[None, :] < (lengths[:, None] + width)).astype(self.mask_dtype)
        positions = lengths[:, None] + np.arange(width)[None, :]
        picks = np.concatenate([b * width + np.arange(len(f)) for b, f in enumerate(fed)])
        logits = self._run(slice(0, n), ids, mask, picks, positions=positions).astype(np.float32, copy=False)
        return np.split(logits, np.cumsum([len(f) for f in fed])[:-1])

    def keep(self, row: int, tokens: int) -> None:
        """Row ``row`` holds ``tokens`` valid tokens (after a verify step: what was accepted)."""
        self.lengths[row] = tokens

    def shrink(self, capacity: int = 256) -> None:
        """Give memory back when idle after long sequences."""
        self.kv.release()
        self.capacity = self.rows = 0
        self._grow(capacity, 1)
