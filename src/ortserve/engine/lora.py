"""Batched LoRA: one session, one KV budget, a different adapter on every row (S-LoRA/Punica style).

At load, ``add_lora`` edits the builder's decoder: after every projection MatMul/MatMulNBits
of every layer (``attn/qkv_proj`` or ``q_proj``/``k_proj``/``v_proj``, ``o_proj``,
``mlp/gate_proj``, ``up_proj``, ``down_proj``, found by the builder's node names) it adds the
LoRA term of each row's adapter, in one of two ways (``mode``, docs/lora.md):

    mask:   y += ((x @ A_all) * mask) @ B_all     every adapter's A side by side; the per-row mask
                                                  holds the row's scale on its adapter's columns
    gather: y += (x @ Gather(A_stack, lora_ids)) * lora_scales @ Gather(B_stack, lora_ids)

(index 0 is the base: no columns in mask mode, the zero adapter in gather mode), the adapter's
import scale folded into B and a request's ``lora_scale`` a per-row multiplier. A batch mixing
the base, several adapters and several scales is one call.

Why the stacks are graph inputs, not initializers: adding or dropping an adapter then costs a
numpy concatenation (milliseconds), not a new session (seconds, and a second prepacked copy
of the weights while both live). Their dims are symbolic, so the rank of the stack is the
largest rank loaded and grows or shrinks with the set. A packed projection (``qkv_proj``,
``gate_up_proj``) takes one term with A = [A_q A_k A_v], split by part before B in mask mode
(one B per part: no block-diagonal zeros to read), a block-diagonal B in gather mode: either is
exactly the three separate terms side by side.

Adapters themselves are numpy, per HF module (``layers.3.q_proj``): A ``[in, r]`` and
B ``[r, out]`` (scale folded). models/adapters.py reads PEFT directories into that form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

IDS = "lora_ids"
SCALES = "lora_scales"  # gather mode: each row's scale multiplier [batch, 1, 1] (mask mode: the mask carries it)
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_OUT = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)/MatMul/output_0$")


@dataclass(frozen=True)
class Target:
    """One projection of the decoder that takes a LoRA term."""

    layer: int
    x: str                             # the activation the projection reads
    output: str                        # the projection's output tensor (the term is added to it)
    parts: tuple[tuple[str, int], ...]  # (HF module, output width) in output order
    inputs: int                        # in features

    @property
    def key(self) -> str:
        return f"layers.{self.layer}.{'+'.join(p for p, _ in self.parts)}"

    @property
    def kind(self) -> str:
        return "+".join(p for p, _ in self.parts)

    @property
    def outputs(self) -> int:
        return sum(w for _, w in self.parts)


@dataclass
class Adapter:
    """A LoRA adapter as numpy: ``weights[f"layers.{i}.{module}"] = (A [in, r], B [r, out])``."""

    name: str
    weights: dict[str, tuple[np.ndarray, np.ndarray]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return max((a.shape[1] for a, _ in self.weights.values()), default=0)


def _weight_dims(graph: Any, node: Any) -> tuple[int, int] | None:
    """(in, out) of a projection node: MatMul's weight initializer is [in, out]; MatMulNBits and
    GgufMatMul (the GGUF-native kernel, models/gguf/native.py) say K, N."""
    if node.op_type in ("MatMulNBits", "GgufMatMul"):
        attrs = {a.name: a.i for a in node.attribute}
        return (attrs["K"], attrs["N"]) if "K" in attrs and "N" in attrs else None
    inits = {t.name: t for t in graph.initializer}
    w = inits.get(node.input[1])
    return (int(w.dims[0]), int(w.dims[1])) if w is not None and len(w.dims) == 2 else None


def find_targets(graph: Any, *, q_width: int, kv_width: int) -> list[Target]:
    """Every decoder projection that can take a LoRA term, with its shapes (from the graph).

    A projection is found by its output, ``/model/layers.{i}/{attn|mlp}/{name}/MatMul/output_0``,
    which the builder's MatMul/MatMulNBits produces, and which GGUF exact imports keep as the
    output of their correction Add (models/gguf/exact.py), so the term lands after both."""
    out = []
    weights = [n for n in graph.node if n.op_type in ("MatMulNBits", "GgufMatMul") or
               (n.op_type == "MatMul" and n.name.endswith("/MatMul"))]
    for node in graph.node:
        for tensor in node.output:
            m = _OUT.match(tensor)
            if m is None or (m.group(3) not in MODULES and m.group(3) not in PACKED):
                continue
            prefix = tensor[: -len("/output_0")]
            weight = next((w for w in weights if w.name.startswith(prefix)), None)
            dims = _weight_dims(graph, weight) if weight is not None else None
            if dims is None:
                continue
            name = m.group(3)
            if name == "qkv_proj":
                parts = (("q_proj", q_width), ("k_proj", kv_width), ("v_proj", kv_width))
            elif name == "gate_up_proj":
                parts = (("gate_proj", dims[1] // 2), ("up_proj", dims[1] // 2))
            else:
                parts = ((name, dims[1]),)
            if sum(w for _, w in parts) != dims[1]:
                continue  # a packing this code does not know: leave the projection alone
            out.append(Target(layer=int(m.group(1)), x=weight.input[0], output=tensor, parts=parts,
                              inputs=dims[0]))
    return out


def add_lora(model: Any, targets: list[Target], dtype: Any, mode: str = "mask") -> None:
    """Edit ``model`` (an onnx ModelProto) in place: the LoRA term after every target.

    ``gather``: per-row weights, ``(x @ Gather(A, ids)) * scale @ Gather(B, ids)`` with A ``[n, in, r]``;
    ``mask``: every adapter at once, ``((x @ A) * mask) @ B`` with A ``[in, n*r]``, B ``[n*r, out]``
    and a per-row mask ``[batch, 1, n*r]``, the row's scale on its adapter's columns, 0 elsewhere
    (one per target kind). A packed projection's term is split by part before B (each part's B is
    its own ``[n*r, width]``: no block-diagonal zeros to read)."""
    from onnx import TensorProto, helper

    elem = TensorProto.FLOAT16 if np.dtype(dtype) == np.float16 else TensorProto.FLOAT
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    graph = model.graph
    if mode == "gather":
        graph.input.append(helper.make_tensor_value_info(IDS, TensorProto.INT64, ["batch_size"]))
        graph.input.append(helper.make_tensor_value_info(SCALES, elem, ["batch_size", 1, 1]))
    by_output = {t.output: t for t in targets}
    nodes = list(graph.node)
    new_nodes = []
    masks: set[str] = set()
    for node in nodes:
        new_nodes.append(node)
        t = next((by_output[o] for o in node.output if o in by_output), None)
        if t is None:
            continue
        a_in, rank = f"lora.{t.key}.A", f"lora_rank/{t.kind}"  # per kind: a packed stack is wider
        y, p = t.output, f"/ortserve/lora/{t.key}"
        if mode == "gather":
            b_in = f"lora.{t.key}.B"
            graph.input.append(helper.make_tensor_value_info(a_in, elem, ["lora_adapters", t.inputs, rank]))
            graph.input.append(helper.make_tensor_value_info(b_in, elem, ["lora_adapters", rank, t.outputs]))
            term = [
                helper.make_node("Gather", [a_in, IDS], [f"{p}/A"], name=f"{p}/GatherA", axis=0),
                helper.make_node("MatMul", [t.x, f"{p}/A"], [f"{p}/xA"], name=f"{p}/MatMulA"),
                helper.make_node("Mul", [f"{p}/xA", SCALES], [f"{p}/xAs"], name=f"{p}/Scale"),
                helper.make_node("Gather", [b_in, IDS], [f"{p}/B"], name=f"{p}/GatherB", axis=0),
                helper.make_node("MatMul", [f"{p}/xAs", f"{p}/B"], [f"{p}/xAB"], name=f"{p}/MatMulB"),
            ]
        else:
            mask = f"lora_mask/{t.kind}"
            if mask not in masks:
                masks.add(mask)
                graph.input.append(helper.make_tensor_value_info(mask, elem, ["batch_size", 1, rank]))
            graph.input.append(helper.make_tensor_value_info(a_in, elem, [t.inputs, rank]))
            term = [helper.make_node("MatMul", [t.x, a_in], [f"{p}/xA"], name=f"{p}/MatMulA"),
                    helper.make_node("Mul", [f"{p}/xA", mask], [f"{p}/xAm"], name=f"{p}/Mask")]
            term += _mask_b(helper, graph, t, p, elem, opset)
        summed = f"{y}/lora"
        for other in nodes:  # everything that read y reads y + the LoRA term
            for i, name in enumerate(other.input):
                if name == y:
                    other.input[i] = summed
        new_nodes += [*term, helper.make_node("Add", [y, f"{p}/xAB"], [summed], name=f"{p}/Add")]
    del graph.node[:]
    graph.node.extend(new_nodes)


def b_name(t: Target, part: int) -> str:
    """``mask`` mode: the B input of a target's part (a packed projection has one per part)."""
    return f"lora.{t.key}.B" if len(t.parts) == 1 else f"lora.{t.key}.B{part}"


def _mask_b(helper: Any, graph: Any, t: Target, p: str, elem: int, opset: int) -> list[Any]:
    """``mask`` mode's B side: one MatMul, or for a packed projection Split -> a MatMul per part -> Concat."""
    part_rank = f"lora_rank/{t.kind}/part"
    for i, (_, width) in enumerate(t.parts):
        graph.input.append(helper.make_tensor_value_info(b_name(t, i), elem,
                                                         [part_rank if len(t.parts) > 1 else f"lora_rank/{t.kind}", width]))
    if len(t.parts) == 1:
        return [helper.make_node("MatMul", [f"{p}/xAm", b_name(t, 0)], [f"{p}/xAB"], name=f"{p}/MatMulB")]
    pieces = [f"{p}/xAm{i}" for i in range(len(t.parts))]
    split = {"num_outputs": len(t.parts)} if opset >= 18 else {}
    return [helper.make_node("Split", [f"{p}/xAm"], pieces, name=f"{p}/Split", axis=-1, **split),
            *[helper.make_node("MatMul", [x, b_name(t, i)], [f"{p}/xAB{i}"], name=f"{p}/MatMulB{i}")
              for i, x in enumerate(pieces)],
            helper.make_node("Concat", [f"{p}/xAB{i}" for i in range(len(t.parts))], [f"{p}/xAB"],
                             name=f"{p}/Concat", axis=-1)]


def kind_ranks(targets: list[Target], adapters: list[Adapter]) -> dict[str, int]:
    """``gather`` mode: the stack rank of each target kind, the widest any adapter needs there."""
    out: dict[str, int] = {}
    for t in targets:
        for a in adapters:
            r = sum(a.weights[f"layers.{t.layer}.{m}"][0].shape[1] for m, _ in t.parts
                    if f"layers.{t.layer}.{m}" in a.weights)
            out[t.kind] = max(out.get(t.kind, 1), r)
        out.setdefault(t.kind, 1)
    return out


def part_ranks(targets: list[Target], adapters: list[Adapter]) -> dict[str, int]:
    """``mask`` mode: per target kind, the widest rank any adapter has on any one part (each part of
    a packed projection gets that many columns per adapter, so the term splits into equal parts)."""
    out: dict[str, int] = {}
    for t in targets:
        ranks = [a.weights[k][0].shape[1] for a in adapters for m, _ in t.parts
                 if (k := f"layers.{t.layer}.{m}") in a.weights]
        out[t.kind] = max([out.get(t.kind, 1), *ranks])
    return out


def stacks(targets: list[Target], adapters: list[Adapter], dtype: Any) -> dict[str, np.ndarray]:
    """``gather`` mode's stack inputs for ``adapters`` (index i+1 is adapters[i]; index 0 is all zeros)."""
    out = {}
    n = len(adapters) + 1
    ranks = kind_ranks(targets, adapters)
    for t in targets:
        rank = ranks[t.kind]
        a_stack = np.zeros((n, t.inputs, rank), dtype=dtype)
        b_stack = np.zeros((n, rank, t.outputs), dtype=dtype)
        for i, adapter in enumerate(adapters, start=1):
            col = row = 0
            for m, width in t.parts:
                w = adapter.weights.get(f"layers.{t.layer}.{m}")
                if w is not None:
                    a, b = w
                    r = a.shape[1]
                    a_stack[i, :, col:col + r] = a
                    b_stack[i, col:col + r, row:row + width] = b
                    col += r
                row += width
        out[f"lora.{t.key}.A"] = a_stack
        out[f"lora.{t.key}.B"] = b_stack
    return out


def mask_stacks(targets: list[Target], adapters: list[Adapter], dtype: Any) -> dict[str, np.ndarray]:
    """``mask`` mode's inputs for ``adapters``: A ``[in, parts*n*r]`` (part-major, then adapter j in
    columns j*r..(j+1)*r of its part) and each part's B ``[n*r, width]``. No zero adapter: a base
    row's mask is all zeros. With no adapters, rank-1 zeros."""
    out = {}
    n = max(1, len(adapters))
    ranks = part_ranks(targets, adapters)
    for t in targets:
        r, parts = ranks[t.kind], len(t.parts)
        a_stack = np.zeros((t.inputs, parts, n, r), dtype=dtype)
        b_stacks = [np.zeros((n, r, width), dtype=dtype) for _, width in t.parts]
        for j, adapter in enumerate(adapters):
            for i, (m, _) in enumerate(t.parts):
                w = adapter.weights.get(f"layers.{t.layer}.{m}")
                if w is not None:
                    a_stack[:, i, j, :w[0].shape[1]] = w[0]
                    b_stacks[i][j, :w[0].shape[1]] = w[1]
        out[f"lora.{t.key}.A"] = a_stack.reshape(t.inputs, parts * n * r)
        for i, b in enumerate(b_stacks):
            out[b_name(t, i)] = b.reshape(n * r, b.shape[2])
    return out


def row_masks(ids: np.ndarray, n: int, ranks: dict[str, int], parts: dict[str, int], dtype: Any) -> dict[str, np.ndarray]:
    """``mask`` mode's inputs for a mixed step: per target kind, 1 on the columns of each row's
    adapter (``ids``: 1..n, 0 the base: no columns) in every part."""
    out = {}
    rows = np.nonzero(ids > 0)[0]
    for kind, r in ranks.items():
        m = np.zeros((len(ids), parts[kind], n, r), dtype=dtype)
        m[rows, :, ids[rows] - 1, :] = 1
        out[f"lora_mask/{kind}"] = m.reshape(len(ids), 1, -1)
    return out


class LoraInputs:
    """One adapter set's stack inputs as OrtValues, bound per step.

    ``mask`` mode keeps, beside the stacks of every adapter, each adapter's own A and B: a step
    whose rows all run one adapter (a single stream; a batch of one tenant) binds that adapter's
    alone, so it reads one adapter's weights, not all of them; a mixed step binds the stacks and
    the row masks. A step of base rows only binds rank-1 zeros. Bindings are swapped only when
    the choice changes (``bound``: the choice each runner binding holds)."""

    def __init__(self, targets: list[Target], adapters: list[Adapter], dtype: Any, mode: str) -> None:
        import onnxruntime as ort

        ov = ort.OrtValue.ortvalue_from_numpy
        self.mode, self.dtype, self.n = mode, dtype, len(adapters)
        self.single: dict[int, tuple[dict[str, Any], dict[str, int]]] = {}
        self.parts = {t.kind: len(t.parts) for t in targets}
        if mode == "gather":
            self.all = {k: ov(v) for k, v in stacks(targets, adapters, dtype).items()}
        else:
            self.all = {k: ov(v) for k, v in mask_stacks(targets, adapters, dtype).items()}
            self.ranks = part_ranks(targets, adapters)
            for i, adapter in enumerate([None, *adapters]):
                own = [adapter] if adapter is not None else []
                arrays = mask_stacks(targets, own, dtype)
                self.single[i] = ({k: ov(v) for k, v in arrays.items()}, part_ranks(targets, own))
        self.bound: dict[Any, Any] = {}

    def bind(self, io: Any, key: Any, ids: np.ndarray, scales: np.ndarray | None = None) -> Any:
        """Bind the LoRA inputs of a step whose rows run adapters ``ids`` with per-request scale
        multipliers ``scales`` (1: the adapter as imported); returns what must live until the run."""
        per_row = (np.ones(len(ids)) if scales is None else scales).astype(self.dtype)[:, None, None]
        if self.mode == "gather":
            choice, inputs, extra = "all", self.all, {IDS: ids.copy(), SCALES: per_row}
        else:
            first = int(ids[0])
            if (ids == first).all():
                inputs, ranks = self.single[first]
                choice = first
                extra = {f"lora_mask/{k}": np.repeat(per_row, self.parts[k] * r, axis=2) for k, r in ranks.items()}
            else:
                choice, inputs = "all", self.all
                extra = {k: v * per_row for k, v in row_masks(ids, self.n, self.ranks, self.parts, self.dtype).items()}
        if self.bound.get(key) != choice:
            for name, value in inputs.items():
                io.bind_ortvalue_input(name, value)
            self.bound[key] = choice
        for name, value in extra.items():
            io.bind_cpu_input(name, value)
        return extra


def adapter_key(name: str, scale: float = 1.0) -> str:
    """What a sequence runs with: the adapter's name, and ``@multiplier`` when a request scales it
    (store ids never hold '@'). Its KV differs with either, so the prefix cache keys on all of it."""
    return name if not name or scale == 1.0 else f"{name}@{float(scale)!r}"


def split_key(key: str) -> tuple[str, float]:
    """``adapter_key``'s (name, scale multiplier)."""
    name, _, scale = key.partition("@")
    return name, float(scale) if scale else 1.0


class AdapterView:
    """An engine as the requests for one adapter see it: ``submit``/``generate`` run on the base
    engine with ``adapter`` set on the sequence; everything else is the base engine's."""

    def __init__(self, engine: Any, adapter: str, model_id: str, reload: Any = None) -> None:
        self.engine = engine
        self.adapter = adapter
        self.model_id = model_id
        self.reload = reload  # () -> Adapter: loads it again if keep_alive dropped it since the lookup

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def _ensure(self) -> None:
        if self.reload is not None and self.adapter not in self.engine.adapter_names:
            self.engine.add_adapter(self.reload())

    def submit(self, **kw: Any) -> Any:
        self._ensure()
        return self.engine.submit(adapter=self.adapter, **kw)

    async def generate(self, **kw: Any) -> Any:
        self._ensure()
        return await self.engine.generate(adapter=self.adapter, **kw)
