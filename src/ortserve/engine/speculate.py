"""Prompt-lookup speculation: guess the next tokens of a sequence from its own context.

RAG answers quote their passages, agents repeat argument values and JSON keys, code edits repeat
the code. When the last n tokens (n from 3 down to 2) occurred before in the prompt or the output,
the tokens that followed them there are a cheap guess of what comes next. The engine feeds the
guesses with the sequence's pending token in one step (engine/core.py ``step``): a step that is
bandwidth-bound costs about one weight read however many positions it computes, so every guess
the model agrees with is a token for free.

Verification is exact by construction: at each position the engine selects a token as it would
without speculation (penalties, logit_bias, grammar mask, temperature, min_p ...), and keeps going
only while that token equals the guess. For a deterministic draft this *is* the standard rejection
rule: the guess t is accepted with probability p(t), and otherwise the token drawn is distributed
as p with t removed and renormalized. So greedy output is identical and sampled output has the
same distribution with speculation on or off.

``Drafter`` is per sequence and holds no tensors: it proposes, and learns from what was accepted
(adaptive k: the guess grows while it is right, shrinks when it is wrong, and a sequence whose
guesses keep failing stops guessing for a while, so free text pays next to nothing).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("ortserve.engine")

MAX_NGRAM = 3
MIN_NGRAM = 1


def lookup(context: np.ndarray, k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the last n tokens of
    ``context`` (n from ``max_ngram`` down to ``min_ngram``); [] when none occurred before."""
    size = len(context)
    if k <= 0 or size < 2:
        return []
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        tail = context[size - n:]
        # candidate starts i < size - n with context[i:i+n] == tail, found from the first token on
        starts = np.flatnonzero(context[:size - n] == tail[0])
        for j in range(1, n):
            if starts.size == 0:
                break
            starts = starts[context[starts + j] == tail[j]]
        if starts.size:
            # the latest match followed by k tokens (the nearest context is the likeliest to
            # repeat), else the earliest: in a run that repeats right before the tail, the
            # latest match is followed by only a token or two, the earliest by the whole run
            full = starts[starts <= size - n - k]
            at = int(full[-1] if full.size else starts[0]) + n
            return [int(t) for t in context[at:at + k]]
    return []


@dataclass
class Drafter:
    """One sequence's proposals and what it learned from their verification."""

    k_max: int = 4
    k: int = 4                # guesses proposed next time
    min_ngram: int = 2        # a single repeated token is too weak a clue in free text (it mostly fails)
    proposed: int = 0         # guesses verified
    accepted: int = 0         # guesses the model agreed with
    steps: int = 0            # verify steps run
    misses: int = 0           # consecutive verify steps with no guess accepted
    rest: int = 0             # steps to wait before guessing again

    def __post_init__(self) -> None:
        self.k = min(self.k, self.k_max)

    def propose(self, context: list[int] | np.ndarray, limit: int) -> list[int]:
        """Guesses for the tokens after ``context`` (its last token is the pending one), at most ``limit``."""
        if self.rest > 0:
            self.rest -= 1
            return []
        return lookup(np.asarray(context, dtype=np.int64), min(self.k, limit), min_ngram=self.min_ngram)

    def record(self, proposed: int, accepted: int) -> None:
        """Learn from one verify step: ``accepted`` of ``proposed`` guesses were right."""
        self.steps += 1
        self.proposed += proposed
        self.accepted += accepted
        if accepted == proposed:
            self.k = min(self.k_max, self.k + 1)
            self.misses = 0
            return
        self.k = max(1, accepted + 1)  # the run that held, and one more
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses:  # nothing held: back off, longer each time it keeps failing
            self.rest = min(64, 4 << min(self.misses - 1, 4))

    def stats(self) -> dict[str, int | float]:
        rate = self.accepted / self.proposed if self.proposed else 0.0
        return {"proposed": self.proposed, "accepted": self.accepted, "steps": self.steps,
                "acceptance": round(rate, 4)}


class Speculation:
    """The engine core's speculative decode step (a mixin of engine/core.py ``EngineCore``).

    ONNX Runtime's CPU GroupQueryAttention takes several new tokens with a past only at batch size
    1 ("batch_size must be 1 when sequence_length > 1 and past context is given"), so a step
    speculates only when one sequence decodes; with more, the batch decodes one token per row as
    before (and a batched step is what pays there anyway).
    """

    speculative: bool = False
    speculative_k: int = 4
    spec_proposed = 0   # guesses verified, all requests
    spec_accepted = 0   # guesses the model agreed with

    def _speculate(self, batch: list[Any]) -> bool:
        """Run this step as a verify step of ``batch``'s one sequence; False when it does not guess."""
        if not self.speculative or len(batch) != 1:
            return False
        seq = batch[0]
        if seq.finished or not seq.params.speculative:
            return False
        if seq.draft is None:
            seq.draft = Drafter(k_max=self.speculative_k, k=self.speculative_k)
        runner = self.runner
        held = int(runner.lengths[seq.row])
        # the KV a verify step writes stays inside the context and the byte budget
        room = min(runner.spec.context_length, runner.byte_limit // (runner.rows * runner.bytes_per_token))
        limit = min(room - held - 1, seq.params.max_tokens - len(seq.output_ids) - 1)
        guesses = seq.draft.propose(seq.prompt_ids + seq.output_ids, limit) if limit > 0 else []
        if not guesses:
            return False
        masks = self._start_masks(batch)
        t0 = time.perf_counter()
        try:
            self.check_fault(seq.id, "step")
            rows = runner.verify([[seq.pending] + guesses])[0]
        except Exception as exc:  # noqa: BLE001 - whatever a kernel raises ends this request only
            self._wait_masks(masks)
            runner.keep(seq.row, held)
            self._fail(seq, exc)
            return True
        self._wait_masks(masks)
        accepted = produced = 0
        for j, logits in enumerate(rows):
            try:
                self.check_fault(seq.id, "postprocess")
                token = self.select(seq, logits, self._masks[0] if masks is not None and j == 0 else None)
                self._advance(seq, token)
            except Exception as exc:
                log.exception("request %s failed in postprocess", seq.id)
                self._fail(seq, exc)
                break
            produced += 1
            if seq.finished or j == len(guesses) or token != guesses[j]:
                break
            accepted += 1  # the guess was the token: its KV, written by this step, is kept
        runner.keep(seq.row, held + 1 + accepted)  # the pending token and the accepted guesses
        seq.draft.record(len(guesses), accepted)
        self.spec_proposed += len(guesses)
        self.spec_accepted += accepted
        now = time.perf_counter()
        self._account_decode(now, now - t0, produced)
        return True
