"""What every reranker returns: per-document scores, ordered best first and cut to ``top_n``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Ranked:
    index: int       # the document's position in the request
    score: float     # higher is more relevant (a probability for sigmoid and judge models)


def order(scores: Sequence[float], top_n: int | None = None) -> list[Ranked]:
    """Best first; ties keep the request's order (a stable sort), so equal scores rank predictably."""
    ranked = sorted((Ranked(i, float(s)) for i, s in enumerate(scores)), key=lambda r: -r.score)
    return ranked if top_n is None else ranked[:top_n]
