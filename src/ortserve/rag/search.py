"""Ranking pieces: the dense index, BM25 query text, reciprocal-rank fusion, attribute filters."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortserve.errors import InvalidRequest

RRF_K = 60
MODES = ("hybrid", "dense", "bm25")
_OPS = {"eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"}


@dataclass
class DenseIndex:
    """All vectors of one vector store in memory: fp32 for scoring, int8 for the exact SIMD pass.

    The int8 pass (usearch's exact search, both cores) picks candidates; fp32 re-scores them,
    so the order is the fp32 cosine order. Chosen by measurement (docs/rag.md): numpy fp32 alone
    is ~2x slower at 100k chunks; an HNSW graph is faster to query but takes minutes to build
    on 2 cores and must be kept in step with SQLite.
    """

    generation: int
    ids: np.ndarray                     # chunk ids (int64), row order
    vectors: np.ndarray                 # (n, d) float32, unit length
    quantized: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.quantized = np.clip(np.round(self.vectors * 127), -127, 127).astype(np.int8)

    def search(self, q: np.ndarray, k: int, rows: np.ndarray | None = None) -> list[tuple[int, float]]:
        """(chunk id, cosine) best first; ``rows`` restricts to those row numbers (filters)."""
        n = len(self.ids)
        if n == 0 or k <= 0:
            return []
        if rows is not None:
            scores = self.vectors[rows] @ q
            top = rows[np.argsort(-scores)[:k]]
        elif n <= 4096:
            scores = self.vectors @ q
            top = np.argpartition(-scores, min(k, n) - 1)[:k] if n > k else np.arange(n)
        else:
            from usearch.index import MetricKind
            from usearch.index import search as exact_search

            cand = min(n, max(4 * k, 64))
            qi = np.clip(np.round(q * 127), -127, 127).astype(np.int8)
            m = exact_search(self.quantized, qi, cand, MetricKind.IP, exact=True, threads=0)
            top = np.asarray(m.keys, dtype=np.int64)
        exact = self.vectors[top] @ q
        order = np.argsort(-exact)[:k]
        return [(int(self.ids[top[i]]), float(exact[i])) for i in order]


def fts_query(text: str) -> str:
    """A safe FTS5 MATCH expression: every word quoted, OR-ed (BM25 ranks by how many match)."""
    words = re.findall(r"\w+", text.lower())
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


def rrf(*rankings: list[int], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal-rank fusion, scaled so that rank 1 in every list scores 1.0."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, cid in enumerate(ranking):
            scores[cid] = scores.get(cid, 0.0) + 1.0 / (k + rank + 1)
    best = len(rankings) / (k + 1)
    return sorted(((c, s / best) for c, s in scores.items()), key=lambda x: -x[1])


def check_filter(f: Any, param: str = "filters") -> dict[str, Any]:
    """OpenAI's attribute filters: {type: eq|ne|gt|gte|lt|lte|in|nin, key, value} or {type: and|or, filters}."""
    if not isinstance(f, dict) or "type" not in f:
        raise InvalidRequest("a filter is an object with 'type'", param=param)
    t = f["type"]
    if t in ("and", "or"):
        subs = f.get("filters")
        if not isinstance(subs, list) or not subs:
            raise InvalidRequest(f"a '{t}' filter needs a non-empty 'filters' list", param=param)
        for s in subs:
            check_filter(s, param)
    elif t in _OPS:
        if not isinstance(f.get("key"), str) or "value" not in f:
            raise InvalidRequest(f"a '{t}' filter needs 'key' and 'value'", param=param)
        if t in ("in", "nin") and not isinstance(f["value"], list):
            raise InvalidRequest(f"an '{t}' filter's value is a list", param=param)
    else:
        raise InvalidRequest(f"unknown filter type {t!r}; use eq, ne, gt, gte, lt, lte, in, nin, and, or",
                             param=param)
    extra = set(f) - {"type", "key", "value", "filters"}
    if extra:
        raise InvalidRequest(f"unknown filter field(s): {', '.join(sorted(extra))}", param=param)
    return f


def matches(f: dict[str, Any], attrs: dict[str, Any]) -> bool:
    t = f["type"]
    if t == "and":
        return all(matches(s, attrs) for s in f["filters"])
    if t == "or":
        return any(matches(s, attrs) for s in f["filters"])
    have, want = attrs.get(f["key"]), f["value"]
    if t == "eq":
        return bool(have == want)
    if t == "ne":
        return bool(have != want)
    if t == "in":
        return have in want
    if t == "nin":
        return have not in want
    if have is None or isinstance(have, bool) != isinstance(want, bool):
        return False
    try:
        return bool({"gt": have > want, "gte": have >= want, "lt": have < want, "lte": have <= want}[t])
    except TypeError:
        return False
