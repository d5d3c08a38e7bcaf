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
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ortserve.engine.speculation.draft import DraftModel

log = logging.getLogger("ortserve.engine")

MAX_NGRAM = 3
MIN_NGRAM = 1
START_K = 4  # a sequence's first guess: k grows from here to speculative_k while its guesses hold


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

    model: Drafter | None = None  # the draft model's adaptive k and counts, once it guessed (engine/speculation/draft.py)

    def take(self, limit: int) -> int:
        """How many guesses to make now (0 while resting after misses), at most ``limit``."""
        if self.rest > 0:
            self.rest -= 1
            return 0
        return min(self.k, limit)

    def propose(self, context: list[int] | np.ndarray, limit: int) -> list[int]:
        """Guesses for the tokens after ``context`` (its last token is the pending one), at most ``limit``."""
        k = self.take(limit)
        return lookup(np.asarray(context, dtype=np.int64), k, min_ngram=self.min_ngram) if k else []

    def record(self, proposed: int, accepted: int) -> None:
        """Learn from one verify step: ``accepted`` of ``proposed`` guesses were right."""
        self.steps += 1
        self.proposed += proposed
        self.accepted += accepted
        self.adapt(proposed, accepted)

    def adapt(self, proposed: int, accepted: int) -> None:
        """Adaptive k: longer while all guesses hold, shorter on a miss, a rest when none held."""
        if accepted == proposed:
            self.k = min(self.k_max, self.k + 1)
            self.misses = 0
            return
        self.k = max(1, accepted + 1)  # the run that held, and one more
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses:  # nothing held: back off, longer each time it keeps failing
            self.rest = min(64, 4 << min(self.misses - 1, 4))

    def stats(self) -> dict[str, Any]:
        """Both kinds of guesses together; with a draft model also ``lookup`` and ``draft`` apart."""
        m = self.model
        proposed = self.proposed + (m.proposed if m else 0)
        accepted = self.accepted + (m.accepted if m else 0)
        out: dict[str, Any] = {"proposed": proposed, "accepted": accepted,
                               "steps": self.steps + (m.steps if m else 0),
                               "acceptance": round(accepted / proposed if proposed else 0.0, 4)}
        if m is not None:
            out["lookup"] = Drafter(proposed=self.proposed, accepted=self.accepted, steps=self.steps).stats()
            out["draft"] = m.stats()
        return out


class Speculation:
    """The engine core's speculative decode step (a mixin of engine/core.py ``EngineCore``).

    ONNX Runtime's CPU GroupQueryAttention takes several new tokens with a past only at batch size
    1 ("batch_size must be 1 when sequence_length > 1 and past context is given"), so a step
    speculates only when one sequence decodes; with more, the batch decodes one token per row as
    before (and a batched step is what pays there anyway).
    """

    speculative: bool = False
    speculative_k: int = 4
    spec_proposed = 0   # guesses verified, all requests (both kinds)
    spec_accepted = 0   # guesses the model agreed with
    lookup: bool = True       # prompt lookup guesses (off: only the draft model does)
    draft_model: DraftModel | None = None  # engine/speculation/draft.py: guesses when prompt lookup has none
    spec_draft_proposed = 0   # of which the draft model's
    spec_draft_accepted = 0

    def _speculate(self, batch: list[Any]) -> bool:
        """Run this step as a verify step of ``batch``'s one sequence; False when it does not guess."""
        if not self.speculative or len(batch) != 1:
            return False
        seq = batch[0]
        if seq.finished or not seq.params.speculative:
            return False
        if seq.draft is None:
            seq.draft = Drafter(k_max=self.speculative_k, k=START_K)
        runner = self.runner
        held = int(runner.lengths[seq.row])
        # the KV a verify step writes stays inside the context and the byte budget
        room = min(runner.spec.context_length, runner.byte_limit // (runner.rows * runner.bytes_per_token))
        limit = min(room - held - 1, seq.params.max_tokens - len(seq.output_ids) - 1)
        t0 = time.perf_counter()
        context = seq.prompt_ids + seq.output_ids
        guesses = seq.draft.propose(context, limit) if limit > 0 and self.lookup else []
        drafter = seq.draft
        if not guesses and self.draft_model is not None and limit > 0:  # no match: the draft model guesses
            drafter = seq.draft.model = seq.draft.model or Drafter(k_max=self.speculative_k, k=START_K)
            guesses = self._draft_guesses(seq, context, drafter.take(limit))
        if not guesses:
            return False
        masks = self._start_masks(batch)
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
        drafter.steps += 1  # counted as they happen: the request's last step is in its final metrics
        drafter.proposed += len(guesses)
        for j, logits in enumerate(rows):
            try:
                self.check_fault(seq.id, "postprocess")
                token = self.select(seq, logits, self._masks[0] if masks is not None and j == 0 else None)
                hit = j < len(guesses) and token == guesses[j]  # its KV, written by this step, is kept
                accepted += hit
                drafter.accepted += hit  # before _advance: a request's last token may finish it
                self._advance(seq, token)
            except Exception as exc:
                log.exception("request %s failed in postprocess", seq.id)
                self._fail(seq, exc)
                break
            produced += 1
            if seq.finished or not hit:
                break
        runner.keep(seq.row, held + 1 + accepted)  # the pending token and the accepted guesses
        drafter.adapt(len(guesses), accepted)
        self.spec_proposed += len(guesses)
        self.spec_accepted += accepted
        if drafter is not seq.draft:
            self.spec_draft_proposed += len(guesses)
            self.spec_draft_accepted += accepted
        now = time.perf_counter()
        self._account_decode(now, now - t0, produced)
        return True

    def _draft_guesses(self, seq: Any, context: list[int], k: int) -> list[int]:
        """The draft model's k greedy guesses; none when it fails (the step decodes as usual)."""
        if k <= 0 or self.draft_model is None:
            return []
        try:
            self.check_fault(seq.id, "draft")
            return self.draft_model.propose(context, k, self.runner.spec.vocab_size)
        except Exception as exc:  # noqa: BLE001 - a failing draft costs its guesses, not the request
            log.warning("draft model %s failed (%s: %s); decoding without it this step", self.draft_model.id,
                        type(exc).__name__, exc)
            self.draft_model.forget()
            return []
