"""Ranking pieces: the dense index, BM25 query text, reciprocal-rank fusion, attribute filters."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortserve.errors import InvalidRequest

MODES = ("hybrid", "dense", "bm25")
_OPS = {"eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"}


NUMPY_MAX_ROWS = 32768   # up to this many rows one exact float32 pass (0.8 ms at 10k); above, binary first
# Above NUMPY_MAX_ROWS the dense pass is two-stage: Hamming distance between sign bits (48 bytes a
# vector for MiniLM's 384 dimensions) keeps the closest rows, then float32 re-scores them. How many
# candidates, measured on 100k real MiniLM embeddings against the exact float32 ranking
# (benchmarks/embeddings.py, recall part; docs/rag.md): 1000 gave recall@10 0.9993 and recall@40
# 0.989, 2000 gave 1.000 and 0.996 for +0.9 ms. So: COARSE_PER_RESULT per result asked for (the
# hybrid pool is 40, so 2000), at least COARSE_MIN, and at least a COARSE_SHARE of the rows, so that
# a store much larger than the measured one keeps as large a share of its rows.
COARSE_MIN = 1000
COARSE_PER_RESULT = 50
COARSE_SHARE = 0.02


@dataclass
class DenseIndex:
    """What one vector store searches, kept in memory per generation: vectors, and per row its file.

    Dense scoring: up to NUMPY_MAX_ROWS rows one float32 matrix-vector product; above, a binary
    (sign-bit Hamming) pass keeps the closest candidates and float32 re-scores them, so the
    order returned is the float32 cosine order of those candidates. Chosen by measurement
    (docs/rag.md): at 100k chunks the binary pass reads 4.8 MB instead of the 38 MB of an exact
    int8 pass (usearch, 9.4 ms quiet) and costs about 1-2 ms with the re-score. The file of each
    row and the file attributes live here too, so that a filter is a numpy mask, not SQL, and a
    search reads no per-file JSON.
    """

    generation: int
    ids: np.ndarray                     # chunk ids (int64), ascending
    vectors: np.ndarray                 # (n, d) float32, unit length
    file_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # row -> index in files
    files: list[str] = field(default_factory=list)
    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)   # file id -> attributes
    bits: np.ndarray | None = None      # (n, words) uint64 sign bits of vectors (computed when not given)
    _columns: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.bits is None:
            self.bits = binarize(self.vectors)

    @property
    def _bits(self) -> np.ndarray:
        assert self.bits is not None
        return self.bits

    def rows_of(self, allowed: set[str]) -> np.ndarray:
        """Row numbers of the chunks of ``allowed`` files."""
        codes = [i for i, f in enumerate(self.files) if f in allowed]
        return np.nonzero(np.isin(self.file_codes, codes))[0]

    def file_of(self, chunk_ids: list[int]) -> list[str | None]:
        """The file of each chunk id (None: a chunk newer than this generation)."""
        if not chunk_ids or not len(self.ids):
            return [None] * len(chunk_ids)
        ask = np.asarray(chunk_ids, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.ids, ask), len(self.ids) - 1)
        hit = self.ids[pos] == ask
        return [self.files[self.file_codes[p]] if h else None for p, h in zip(pos, hit, strict=True)]

    def search(self, q: np.ndarray, k: int, rows: np.ndarray | None = None) -> list[tuple[int, float]]:
        """(chunk id, cosine) best first; ``rows`` restricts to those row numbers (filters)."""
        n = len(self.ids) if rows is None else len(rows)
        if n == 0 or k <= 0:
            return []
        if n > NUMPY_MAX_ROWS:
            cand = self.coarse(q, max(COARSE_MIN, COARSE_PER_RESULT * k, int(COARSE_SHARE * n)), rows)
            exact = _dot(self.vectors[cand], q)
        elif rows is None:     # every row: no gathered copy of the matrix
            cand, exact = np.arange(n), _dot(self.vectors, q)
        else:
            cand, exact = rows, _dot(self.vectors[rows], q)
        if len(cand) > k:
            top = np.argpartition(-exact, k - 1)[:k]
            cand, exact = cand[top], exact[top]
        order = np.argsort(-exact, kind="stable")
        return [(int(self.ids[cand[i]]), float(exact[i])) for i in order]

    def coarse(self, q: np.ndarray, cand: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Row numbers of at least ``cand`` rows closest to ``q`` by sign-bit Hamming distance
        (every row tied with the last one kept too), among ``rows`` when given."""
        cols = self._columns
        if cols is None or cols.shape[1] != len(self.ids):   # one (words, n) copy per generation
            cols = self._columns = np.ascontiguousarray(self._bits.T)
        qb = binarize(q[None, :])[0]
        dist = np.bitwise_count(cols[0] ^ qb[0]).astype(np.uint16)
        for w in range(1, len(qb)):          # word by word: contiguous 800 KB passes at 100k rows
            dist += np.bitwise_count(cols[w] ^ qb[w])
        if rows is not None:
            dist = dist[rows]
        if cand >= len(dist):
            return np.arange(len(dist)) if rows is None else rows
        # the distance of the cand-th closest, from a histogram (cheaper than argpartition)
        limit = int(np.searchsorted(np.cumsum(np.bincount(dist)), cand))
        keep = np.flatnonzero(dist <= limit)
        return keep if rows is None else rows[keep]


def _dot(m: np.ndarray, q: np.ndarray) -> np.ndarray:
    """m @ q on the calling thread. numpy's ``@`` goes to OpenBLAS, whose threads wait for each
    other: on the busy 2-core machine a 10k x 384 product took 64-110 ms that way and 0.8 ms
    with einsum (its own single-threaded SIMD loop)."""
    return np.einsum("ij,j->i", m, q)


def binarize(vectors: np.ndarray) -> np.ndarray:
    """(n, d) float -> (n, ceil(d/64)) uint64: bit j of a row is set where dimension j is > 0."""
    packed = np.packbits(vectors > 0, axis=1)
    pad = -packed.shape[1] % 8
    if pad:
        packed = np.pad(packed, ((0, 0), (0, pad)))
    return np.ascontiguousarray(packed).view(np.uint64)


# English function words left out of the BM25 query: in an OR-query each one matches most
# chunks, so a question's "which/how/the/is" outvote its one rare term. Dropping them took
# BM25 recall@5 from 0.883 to 0.950 on the shipped question set (docs/rag.md). A standard short
# list, not tuned on the questions; a query of stopwords only keeps them all.
STOPWORDS = frozenset((
    "a", "an", "the", "of", "to", "in", "on", "for", "and", "or", "is", "are", "was", "were", "be", "been",
    "by", "with", "as", "at", "it", "its", "this", "that", "these", "those", "which", "what", "how", "why",
    "when", "where", "who", "whom", "do", "does", "did", "can", "could", "should", "would", "will", "shall",
    "may", "might", "must", "from", "into", "than", "then", "there", "their", "them", "they", "i", "me",
    "my", "you", "your", "we", "our", "us", "he", "she", "his", "her", "not", "no", "if", "so", "about",
    "use", "used", "using", "has", "have", "had",
))
# Reciprocal-rank fusion: k and the weight of each list, chosen on the tuning half of the question
# set (even-numbered questions) and checked on the held-out half (docs/rag.md). BM25 counts double:
# on technical docs it is the stronger list; dense still lifts paraphrased questions.
RRF_K = 10
DENSE_WEIGHT, BM25_WEIGHT = 1.0, 2.0


def fts_query(text: str) -> str:
    """A safe FTS5 MATCH expression: every word quoted, OR-ed (BM25 ranks by how many match),
    stopwords left out unless nothing else is left."""
    words = list(dict.fromkeys(re.findall(r"\w+", text.lower())))
    content = [w for w in words if w not in STOPWORDS]
    return " OR ".join(f'"{w}"' for w in (content or words))


def rrf(*rankings: list[int], k: int = RRF_K, weights: tuple[float, ...] | None = None) -> list[tuple[int, float]]:
    """Weighted reciprocal-rank fusion, scaled so that rank 1 in every list scores 1.0."""
    weights = weights or (1.0,) * len(rankings)
    scores: dict[int, float] = {}
    for ranking, w in zip(rankings, weights, strict=True):
        for rank, cid in enumerate(ranking):
            scores[cid] = scores.get(cid, 0.0) + w / (k + rank + 1)
    best = sum(weights) / (k + 1)
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
