"""Rows fed as embeddings: a runner for decoders that take ``inputs_embeds`` and multi-row
positions (vision-language models, issue 42; docs/vision.md), and the engine over it.

A vision-language decoder (Qwen2.5-VL's as exported) takes ``inputs_embeds`` instead of
``input_ids`` and ``position_ids`` of shape [3, batch, tokens] (Qwen's mRoPE: time, height, width).
Everything else is the text runner's: one KV row per sequence, batched decode over rows
``0..n-1``, chunked prefill, the prefix cache. What differs is only how a row is fed, and that is
left to a ``Feed`` the model family supplies (vision/rows.py for Qwen2.5-VL):

* ``embed(ids)``: the embeddings of token ids. An image's tokens are *virtual ids* (above the
  vocabulary), one per image token, naming the image and the token's place in it; the feed
  splices the image's features there. Since the ids name the image, the prefix cache (which
  compares token ids) keys on images as well as text: the same image after the same text reuses
  the KV, another image after the same text shares only the text before it.
* ``positions(held, start)``: the positions [rows, n] of ``held[start:]``, where ``held`` is every
  id the KV row holds (positions after an image depend on the image's grid).
* ``offset(held)``: what a decode step adds to the row's length to get the next token's position
  (Qwen's ``rope_deltas``), the same on every position row.

The runner keeps each row's fed ids (``held``, the prompt's and each decoded token) beside its KV,
so a chunk, a copied prefix or a cached block knows its positions (a later turn's prompt may
match into a cached answer). Decoded tokens are text: they never move the offset.
Speculation (``verify``) and LoRA are not served here; the engine turns speculation off.
``EmbedsCore`` applies the repetition penalty itself (the sampler's indexes logits by prompt ids).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from ortserve.engine.core import EngineCore
from ortserve.engine.engine import AsyncEngine, LoadedModel
from ortserve.engine.reasoning import ThinkBudget
from ortserve.engine.runner import Runner
from ortserve.engine.runtime import DeviceChoice
from ortserve.engine.sequence import Sequence
from ortserve.engine.spec import ModelSpec
from ortserve.errors import ModelError
from ortserve.types import SamplingParams


class Feed(Protocol):
    """What a model family supplies to feed its rows (vision/rows.py)."""

    position_rows: int
    placeholder_id: int   # the real token a virtual id stands for (Qwen's <|image_pad|>): repetition penalty

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """Token ids [n] (virtual image ids among them) -> embeddings [n, hidden]."""
        ...

    def positions(self, held: np.ndarray, start: int) -> np.ndarray:
        """The positions [position_rows, len(held) - start] of ``held[start:]``."""
        ...

    def offset(self, held: np.ndarray) -> int:
        """The next text token's position minus ``len(held)``."""
        ...


@dataclass
class Block:
    """A saved row for the prefix cache: its KV and the ids it was fed."""

    kv: Any
    held: list[int]


class EmbedsRunner(Runner):
    """The text runner, fed embeddings and multi-row positions instead of token ids."""

    def __init__(self, spec: ModelSpec, feed: Feed, **kw: Any) -> None:
        kw["lora"] = False
        super().__init__(spec, **kw)
        inputs = {i.name: i for i in self.session.get_inputs()}
        if "inputs_embeds" not in inputs:
            raise ModelError(f"{spec.onnx_path} takes no inputs_embeds (inputs: {list(inputs)})")
        self.feed = feed
        self.embeds_dtype = np.float16 if inputs["inputs_embeds"].type == "tensor(float16)" else np.float32
        # a 1-D family's decoder (Mistral 3's as exported) may take no positions at all (its attention
        # counts them from the mask: past + i, the feed's own), or [batch, tokens]; Qwen's takes [3, batch, tokens]
        pos = inputs.get("position_ids")
        self.pos_rank = len(pos.shape) if pos is not None else 0
        self.pos_dtype = np.int32 if pos is not None and pos.type == "tensor(int32)" else np.int64
        self.held: list[list[int]] = [[] for _ in range(self.slots)]   # each row's fed ids
        self.offsets = np.zeros(self.slots, dtype=np.int64)            # each row's decode position offset
        self.steps = 0            # model runs (prefill chunks and decode steps)
        self.decode_rows = 0      # rows fed by batched decode steps, summed
        self.widest = 0           # the most rows one decode step ran

    # ---- the rows' ids, kept beside their KV ------------------------------------
    def _hold(self, row: int, ids: list[int]) -> None:
        self.held[row] = ids
        self.offsets[row] = self.feed.offset(np.asarray(ids, dtype=np.int64)) if ids else 0

    def move(self, src: int, dst: int) -> None:
        super().move(src, dst)
        self.held[dst], self.held[src] = self.held[src], []
        self.offsets[dst], self.offsets[src] = self.offsets[src], 0

    def clear(self, row: int) -> None:
        super().clear(row)
        self.held[row], self.offsets[row] = [], 0

    def save(self, row: int) -> Block:
        return Block(super().save(row), list(self.held[row][:int(self.lengths[row])]))

    def load(self, row: int, block: Any, tokens: int, *, total: int) -> None:
        super().load(row, block.kv, tokens, total=total)
        self._hold(row, block.held[:tokens])

    def copy_prefix(self, src: int, dst: int, tokens: int, *, total: int) -> None:
        super().copy_prefix(src, dst, tokens, total=total)
        self._hold(dst, self.held[src][:tokens])

    # ---- compute ------------------------------------------------------------------
    def _run_embeds(self, rows: slice, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray,
                    picks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """One step over ``embeds`` [B, T, hidden] with ``positions`` [P, B, T]; the logits of ``picks``."""
        io = self._binding(rows)
        io.bind_cpu_input("inputs_embeds", np.ascontiguousarray(embeds, dtype=self.embeds_dtype))
        io.bind_cpu_input("attention_mask", mask.astype(self.mask_dtype, copy=False))
        if self.pos_rank:
            pos = positions if self.pos_rank == 3 else positions[0]
            io.bind_cpu_input("position_ids", np.ascontiguousarray(pos, dtype=self.pos_dtype))
        self.steps += 1
        return self._run_bound(io, picks, out)

    def prefill(self, row: int, ids: list[int], *, start: int = 0, total: int | None = None) -> np.ndarray:
        n = len(ids)
        self.ensure_rows(row + 1)
        self.ensure_capacity(max(total or 0, start + n) + 1)
        if len(self.held[row]) < start:
            raise ModelError(f"row {row} holds {len(self.held[row])} fed ids for {start} tokens of KV")
        held = self.held[row][:start] + [int(i) for i in ids]
        arr = np.asarray(held, dtype=np.int64)
        positions = self.feed.positions(arr, start)[:, None, :]
        embeds = self.feed.embed(arr[start:])[None]
        mask = np.ones((1, start + n), dtype=self.mask_dtype)
        logits = self._run_embeds(slice(row, row + 1), embeds, mask, positions, np.asarray([n - 1]))
        self.lengths[row] = start + n
        self._hold(row, held)
        return logits[-1].astype(np.float32, copy=False)

    def decode(self, tokens: np.ndarray, start: int = 0) -> np.ndarray:
        n = len(tokens)
        lengths = self.lengths[start:start + n]
        total = int(lengths.max()) + 1
        self.ensure_capacity(total)
        mask = (np.arange(total)[None, :] <= lengths[:, None]).astype(self.mask_dtype)
        pos = (lengths + self.offsets[start:start + n])[None, :, None]
        positions = np.broadcast_to(pos, (self.feed.position_rows, n, 1))
        embeds = self.feed.embed(np.asarray(tokens, dtype=np.int64)).reshape(n, 1, -1)
        logits = self._run_embeds(slice(start, start + n), embeds, mask, positions, np.arange(n), self._logits[:, :n])
        lengths += 1
        for i, token in enumerate(tokens.tolist()):   # a saved row holds its answer's KV too
            self.held[start + i].append(token)
        self.decode_rows += n
        self.widest = max(self.widest, n)
        return logits.astype(np.float32, copy=False)

    def verify(self, fed: list[list[int]]) -> list[np.ndarray]:
        raise ModelError("speculative decoding is not served on embedding-fed rows (the engine turns it off)")


class EmbedsModel(LoadedModel):
    """A LoadedModel whose runner is an EmbedsRunner over ``feed`` (CPU: the feed's sessions are)."""

    def __init__(self, model_dir: Any, feed: Feed, settings: Any = None, model_id: str | None = None) -> None:
        self.feed = feed
        super().__init__(model_dir, settings, model_id)

    def _load(self, settings: Any, slots: int) -> tuple[Runner, DeviceChoice]:
        from ortserve.engine.runtime import session_options

        so = session_options(settings, self.spec.session_options)
        runner = EmbedsRunner(self.spec, self.feed, slots=slots, providers=["CPUExecutionProvider"],
                              session_options=so, huge_pages=bool(getattr(settings, "huge_pages", True)),
                              last_logits_only=bool(getattr(settings, "last_logits_only", True)))
        return runner, DeviceChoice("cpu", "CPUExecutionProvider", "embedding-fed rows run on the CPU provider")


class EmbedsCore(EngineCore):
    """The engine loop over an EmbedsRunner. One difference: the repetition penalty reads the
    prompt's ids, and a virtual id is no vocabulary entry; the penalty is applied here instead,
    over the prompt with each virtual id read as the token it stands for (og's generator and
    transformers penalize ``<|image_pad|>`` as the prompt holds it)."""

    def add(self, seq: Sequence) -> None:
        vocab = self.runner.spec.vocab_size
        if seq.params.repetition_penalty != 1.0 and any(i >= vocab for i in seq.prompt_ids):
            feed = self.runner.feed
            seq.penalty = seq.params.repetition_penalty  # type: ignore[attr-defined]
            seq.penalized = {i if i < vocab else feed.placeholder_id for i in seq.prompt_ids}  # type: ignore[attr-defined]
            seq.params = replace(seq.params, repetition_penalty=1.0)
        super().add(seq)

    def select(self, seq: Sequence, logits: np.ndarray, mask: np.ndarray | None = None) -> int:
        penalty = getattr(seq, "penalty", None)
        if penalty is not None:
            logits = logits.copy()
            seen = np.fromiter(seq.penalized | seq.counts.keys(), dtype=np.int64)  # type: ignore[attr-defined]
            vals = logits[seen]
            logits[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
        return super().select(seq, logits, mask)


class EmbedsEngine(AsyncEngine):
    """The engine (queue, batching, prefix cache, watchdog) over an EmbedsModel; no speculation
    (prompt lookup could guess a virtual id), no reasoning budget (the prompt holds virtual ids)."""

    def _new_core(self, runner: Runner) -> EngineCore:
        s = self.settings
        return EmbedsCore(runner, chunk_tokens=int(getattr(s, "prefill_chunk", 512)),
                          prefill_ratio=float(getattr(s, "prefill_ratio", 0.0)), kv_budget_bytes=self.kv_budget,
                          guidance=self.model.guidance, prefix_cache=bool(getattr(s, "prefix_cache", True)),
                          speculative=False)

    def think_budget(self, ids: list[int], params: SamplingParams) -> ThinkBudget | None:
        return None
