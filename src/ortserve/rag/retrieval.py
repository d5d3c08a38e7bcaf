"""The search side of the RAG store: hybrid search over one vector store, and the in-memory
dense index it keeps as a cache of the store's SQLite rows (loaded once, then refreshed by
appending new chunk ids when the store's generation moves).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ortserve.errors import InvalidRequest, disk_full
from ortserve.rag.schema import tx
from ortserve.rag.search import (
    BM25_WEIGHT,
    DENSE_WEIGHT,
    MODES,
    DenseIndex,
    binarize,
    check_filter,
    fts_query,
    matches,
    rrf,
)


class SearchMixin:
    """The RagStore side of search: the dense index cache, BM25 through FTS5, their fusion."""

    # provided by RagStore
    main: sqlite3.Connection
    _dense: dict[str, DenseIndex]
    _touched: dict[str, int]
    _lock: threading.RLock
    _embedder: Callable[[], Any]
    _row: Any
    _store: Any

    def _dense_index(self, vid: str) -> DenseIndex:
        con = self._store(vid)
        gen = int(con.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])
        with self._lock:
            idx = self._dense.get(vid)
            if idx is None:
                idx = self._dense[vid] = _load_index(con, gen, self._embedder().dimensions)
            elif idx.generation != gen:
                idx = self._dense[vid] = _refresh_index(con, idx, gen)
            return idx

    def search(self, vid: str, query: str, *, k: int = 10, filters: dict[str, Any] | None = None,
               mode: str = "hybrid", score_threshold: float = 0.0) -> list[dict[str, Any]]:
        """Best chunks for ``query``: dense, BM25 (FTS5) or both fused by reciprocal rank.

        The query is embedded on a helper thread while FTS5 answers the BM25 half (onnxruntime
        and SQLite both release the GIL), so hybrid costs about max(embed, BM25) + the dense pass.
        """
        try:
            return self._search(vid, query, k, filters, mode, score_threshold)
        except sqlite3.ProgrammingError:   # "Cannot operate on a closed database"
            self._row(vid)   # the store was deleted under the search (its connection closed): 404
            raise

    def _search(self, vid: str, query: str, k: int, filters: dict[str, Any] | None, mode: str,
                score_threshold: float) -> list[dict[str, Any]]:
        self._row(vid)
        if mode not in MODES:
            raise InvalidRequest(f"search mode {mode!r}: use {', '.join(MODES)}", param="search_mode")
        if not query.strip():
            raise InvalidRequest("'query' must not be empty", param="query")
        con = self._store(vid)
        idx = self._dense_index(vid)
        allowed = rows = None
        if filters is not None:
            check_filter(filters)
            allowed = {fid for fid, a in idx.attrs.items() if matches(filters, a)}
            rows = idx.rows_of(allowed)
        pool = max(k * 4, 40)
        emb = self._embedder() if mode != "bm25" else None
        qvec = _query_pool().submit(lambda: emb.embed_texts([query], truncate=True).vectors[0]) if emb else None
        bm25 = self._bm25(con, idx, query, pool, allowed) if mode != "dense" else []
        dense = idx.search(qvec.result(), pool, rows) if qvec is not None else []
        if mode == "dense":
            ranked = dense
        elif mode == "bm25":
            ranked = [(c, 1.0 / (1 + r)) for r, c in enumerate(bm25)]
        else:
            ranked = rrf([c for c, _ in dense], bm25, weights=(DENSE_WEIGHT, BM25_WEIGHT))
        ranked = [(c, s) for c, s in ranked if s >= score_threshold][:k]
        self._touch(vid)
        return self._results(con, ranked)

    def _touch(self, vid: str) -> None:
        """last_active_at, written at most once a minute per store: a search is not worth an fsync."""
        now = int(time.time())
        if now - self._touched.get(vid, 0) < 60:
            return
        self._touched[vid] = now
        try:
            with tx(self.main) as m:
                m.execute("UPDATE vector_stores SET last_active_at=? WHERE id=?", (now, vid))
        except sqlite3.OperationalError as exc:   # a full disk: the search still answers
            if not disk_full(exc):
                raise

    def _bm25(self, con: sqlite3.Connection, idx: DenseIndex, query: str, k: int,
              allowed: set[str] | None) -> list[int]:
        """FTS5's BM25 top ``k``. FTS5 alone (no join: a join made it 4x slower at 100k chunks);
        with a filter, the ranked matches are read in batches and kept by the in-memory
        chunk -> file map until ``k`` pass (FTS5 scores every match before the first row anyway)."""
        match = fts_query(query)
        if not match or (allowed is not None and not allowed):
            return []
        sql = "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts) LIMIT ?"
        if allowed is None:
            return [r[0] for r in con.execute(sql, (match, k))]
        got: list[int] = []
        sql = "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts)"
        for cur in _batches(con.execute(sql, (match,)), 256):
            got += [c for c, f in zip(cur, idx.file_of(cur), strict=True) if f in allowed]
            if len(got) >= k:
                break
        return got[:k]

    def _results(self, con: sqlite3.Connection, ranked: list[tuple[int, float]]) -> list[dict[str, Any]]:
        """Text and metadata of the final top k only, in one query."""
        if not ranked:
            return []
        rows = {c["id"]: c for c in con.execute(
            'SELECT c.id, c.file_id, c.idx, c.text, c.start, c."end", v.filename, v.attributes FROM chunks c '
            f"JOIN vs_files v ON v.file_id = c.file_id WHERE c.id IN ({','.join('?' * len(ranked))})",
            [cid for cid, _ in ranked])}
        out = []
        for cid, score in ranked:
            c = rows.get(cid)
            if c is None:
                continue
            out.append({"file_id": c["file_id"], "filename": c["filename"], "score": round(score, 6),
                        "attributes": json.loads(c["attributes"]),
                        "content": [{"type": "text", "text": c["text"]}],
                        "chunk_index": c["idx"], "start": c["start"], "end": c["end"]})
        return out


def _load_index(con: sqlite3.Connection, generation: int, dim: int) -> DenseIndex:
    """The in-memory search state of one store, read from SQLite (a cache of it)."""
    rows = con.execute("SELECT id, file_id, vector FROM chunks ORDER BY id").fetchall()
    files: dict[str, int] = {}
    codes = np.fromiter((files.setdefault(r[1], len(files)) for r in rows), dtype=np.int32, count=len(rows))
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    vecs = (np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(-1, dim)
            if rows else np.zeros((0, dim), np.float32))
    attrs = {r[0]: json.loads(r[1]) for r in con.execute("SELECT file_id, attributes FROM vs_files")}
    # in buffers with headroom, so that the refreshes after a file is added append without a copy
    return DenseIndex(generation, _append(np.zeros(0, np.int64), ids), _append(np.zeros((0, dim), np.float32), vecs),
                      _append(np.zeros(0, np.int32), codes), list(files), attrs,
                      _append(np.zeros((0, -(-dim // 64)), np.uint64), binarize(vecs)))


def _refresh_index(con: sqlite3.Connection, old: DenseIndex, generation: int) -> DenseIndex:
    """``old`` brought up to date without reading every vector again (seconds at 100k chunks).

    Chunk ids are never reused (next_chunk_id), so new chunks are those with id > old's last,
    and a file's chunks are only ever deleted all together, so the rows to drop are those of
    files that now have no chunk with id <= last (removed, or re-processed under new ids).
    With nothing to drop, the new rows go into the arrays' spare capacity (_append: no copy).
    """
    last = int(old.ids[-1]) if len(old.ids) else 0
    still = {r[0] for r in con.execute("SELECT DISTINCT file_id FROM chunks WHERE id <= ?", (last,))}
    gone = [i for i, f in enumerate(old.files) if f not in still]
    ids, vectors, codes, bits = old.ids, old.vectors, old.file_codes, old._bits
    if gone:
        keep = ~np.isin(codes, gone)
        if not keep.all():
            ids, vectors, codes, bits = ids[keep], vectors[keep], codes[keep], bits[keep]
    rows = con.execute("SELECT id, file_id, vector FROM chunks WHERE id > ? ORDER BY id", (last,)).fetchall()
    files = {f: i for i, f in enumerate(old.files)}
    new_codes = np.fromiter((files.setdefault(r[1], len(files)) for r in rows), dtype=np.int32, count=len(rows))
    dim = vectors.shape[1]
    vecs = (np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(-1, dim)
            if rows else np.zeros((0, dim), np.float32))
    parsed: dict[str, dict[str, Any]] = {}          # most files share their attributes' JSON text
    attrs = {r[0]: parsed.get(r[1]) or parsed.setdefault(r[1], json.loads(r[1]))
             for r in con.execute("SELECT file_id, attributes FROM vs_files")}
    return DenseIndex(generation, _append(ids, np.fromiter((r[0] for r in rows), np.int64, len(rows))),
                      _append(vectors, vecs), _append(codes, new_codes), list(files), attrs,
                      _append(bits, binarize(vecs)))


def _append(arr: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """``arr`` + ``extra`` rows. ``arr`` is a prefix view of a larger buffer when it came from
    here: if that buffer has room, ``extra`` is written after it (an older index keeps seeing
    only its own prefix); else a new buffer with 50% headroom is made."""
    n, m = len(arr), len(extra)
    if m == 0:
        return arr
    base = arr.base
    if (isinstance(base, np.ndarray) and base.ndim == arr.ndim and base.dtype == arr.dtype
            and base.shape[1:] == arr.shape[1:] and base.shape[0] >= n + m
            and base.__array_interface__["data"][0] == arr.__array_interface__["data"][0]
            and arr.flags.c_contiguous and base.flags.c_contiguous and base.flags.writeable):
        base[n:n + m] = extra
        return base[:n + m]
    buf = np.empty((n + m + (n + m) // 2, *arr.shape[1:]), dtype=arr.dtype)
    buf[:n] = arr
    buf[n:n + m] = extra
    return buf[:n + m]


_QUERY_POOL: ThreadPoolExecutor | None = None


def _query_pool() -> ThreadPoolExecutor:
    """Threads that embed search queries while the calling thread runs FTS5."""
    global _QUERY_POOL
    if _QUERY_POOL is None:
        _QUERY_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rag-query")
    return _QUERY_POOL


def _batches(cur: sqlite3.Cursor, n: int) -> Iterator[list[int]]:
    while rows := cur.fetchmany(n):
        yield [r[0] for r in rows]
