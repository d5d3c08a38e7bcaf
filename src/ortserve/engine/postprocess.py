"""Postprocess, per sequence: what one row does with its logits (engine/core.py's step calls it).

Logits processors, the grammar mask and sampling pick the token (``select``), unless a spent
reasoning budget forces the close of the reasoning block (engine/reasoning.py ``ThinkBudget``); ``_advance``
streams its text or finishes the sequence (EOS, a stop string, max_tokens, the context);
``_finish`` and ``_fail`` send the last event. A mixin of ``EngineCore``, like
engine/speculation/speculate.py's ``Speculation``: it reads the core's ``runner``, ``eos`` and ``faults``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ortserve.engine.guidance import apply_mask
from ortserve.engine.sampler import apply_penalties, greedy_unless, sample, token_logprobs
from ortserve.engine.sequence import Sequence
from ortserve.types import TokenEvent

log = logging.getLogger("ortserve.engine")


class Postprocess:
    """Sample, stream and finish one sequence at a time; what raises here ends only that request."""

    runner: Any
    eos: set[int]
    faults: dict[str, Any]
    _one_mask: np.ndarray
    total_output_tokens: int
    failed_rows: int
    check_fault: Callable[[str, str], None]  # engine/loop.py's EngineThread

    def _postprocess(self, seq: Sequence, logits: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Everything one sequence does with its logits row; what raises here ends only this request."""
        if seq.finished:
            return
        try:
            self.check_fault(seq.id, "postprocess")
            token = self.select(seq, logits, mask)
            self._advance(seq, token)
        except Exception as exc:
            log.exception("request %s failed in postprocess", seq.id)
            self._fail(seq, exc)

    def select(self, seq: Sequence, logits: np.ndarray, mask: np.ndarray | None = None) -> int:
        """Logits processors, then the grammar mask, then sampling: the token this sequence takes next."""
        p = seq.params
        if seq.plain_greedy:  # the general path's pick, without its copy of the row
            suppressed = self.eos if p.ignore_eos or len(seq.output_ids) < p.min_tokens else ()
            if (token := greedy_unless(logits, suppressed)) is not None:
                return token
        raw = logits
        if len(seq.output_ids) < p.min_tokens or p.ignore_eos:
            logits = logits.copy()
            logits[list(self.eos)] = -np.inf
        elif p.edits_logits or seq.guide:
            logits = logits.copy()
        logits = apply_penalties(logits, p, seq.prompt_ids, seq.counts)
        if seq.guide is not None:
            if mask is None:  # after prefill: this row's mask alone
                mask = self._one_mask[0]
                seq.guide.compute_mask(mask)
            apply_mask(logits, mask)
            if not np.isfinite(logits).any():  # the grammar allows only the end (min_tokens gives way)
                logits[next(iter(self.eos))] = 0.0
        forced = seq.think.forced() if seq.think is not None else None
        if forced is not None and np.isfinite(logits[forced]):  # the reasoning budget is spent: close the block
            token = forced
        else:
            token = sample(logits, p, seq.rng)
        if p.logprobs is not None and token not in self.eos:
            seq.logprobs.append(token_logprobs(raw, token, p.logprobs))
        return token

    def _advance(self, seq: Sequence, token: int) -> None:
        """Take ``token``: stream its text, or finish on EOS, a stop string, max_tokens or the context."""
        if token in self.eos:
            self._finish(seq, "stop")
            return
        if seq.guide is not None:
            seq.guide.consume(token)
        if seq.think is not None:
            seq.think.observe(token)
        text = seq.accept(token)
        self.total_output_tokens += 1
        if seq.stop.stopped or (seq.guide is not None and seq.guide.stopped):
            self._emit(seq, text)
            # the guide ended it: complete (engine/closing.py closes JSON and required calls in time)
            self._finish(seq, seq.guide.finish_reason if seq.guide is not None and seq.guide.stopped else "stop")
        elif (len(seq.output_ids) >= seq.params.max_tokens
              or len(seq.prompt_ids) + len(seq.output_ids) >= self.runner.spec.context_length):
            self._emit(seq, text)
            self._finish(seq, "length")
        elif text:
            self._emit(seq, text, [token])

    def _emit(self, seq: Sequence, text: str, ids: list[int] | None = None) -> None:
        seq.sink(TokenEvent(request_id=seq.id, text=text, token_ids=ids or [], logprobs=self._take_logprobs(seq)))

    @staticmethod
    def _take_logprobs(seq: Sequence) -> list[tuple[int, float, list[tuple[int, float]]]] | None:
        if seq.params.logprobs is None:
            return None
        out, seq.logprobs = seq.logprobs, []
        return out

    def _finish(self, seq: Sequence, reason: str, error: str | None = None, code: str | None = None) -> None:
        if seq.finished:
            return
        text = seq.tail() if reason in ("stop", "length") else ""
        seq.finished = True
        seq.reason = reason
        self.faults.pop(seq.id, None)
        seq.sink(TokenEvent(request_id=seq.id, text=text, finished=True, finish_reason=reason,
                            metrics=seq.metrics(), error=error, error_code=code, logprobs=self._take_logprobs(seq),
                            stop_sequence=seq.stop.matched if reason == "stop" else None))

    def _fail(self, seq: Sequence, exc: BaseException) -> None:
        self.failed_rows += 1
        log.warning("request %s failed alone: %s: %s", seq.id, type(exc).__name__, exc)
        self._finish(seq, "error", error=f"generation failed: {type(exc).__name__}: {exc}")
