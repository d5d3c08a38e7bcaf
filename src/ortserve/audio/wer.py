"""Word error rate after a light normalization (case, punctuation, number words left as spoken)."""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("’", "'"))


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words): Levenshtein over words."""
    ref, hyp = words(reference), words(hypothesis)
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1], len(ref)


def wer(references: list[str], hypotheses: list[str]) -> float:
    """Corpus word error rate: total edits over total reference words."""
    edits = total = 0
    for r, h in zip(references, hypotheses, strict=True):
        e, n = word_errors(r, h)
        edits, total = edits + e, total + n
    return edits / max(1, total)
