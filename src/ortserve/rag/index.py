"""The embedded RAG store: files, vector stores, chunks, vectors and BM25, in SQLite.

Layout under ``root`` (HOME/rag)::

    rag.sqlite            files and the vector-store registry
    files/<file_id>       uploaded bytes (written and fsynced before their row commits)
    stores/<vs_id>.sqlite one vector store: its files, chunks (text, offsets, vector), FTS5 BM25

Crash safety: a file's chunks, vectors, BM25 rows and its ``completed`` status are written in
one SQLite transaction (WAL, synchronous=FULL), after all the embedding work is done. A
``kill -9`` at any point leaves either the old state or the new one; a rerun of the same
ingest finds what is missing (or changed, by SHA-256) and completes it. The dense index is a
cache rebuilt from SQLite when the store's generation moves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import InvalidRequest, NotFound
from ortserve.rag.ingest import Chunk, chunk_text, parse
from ortserve.rag.jobs import JobsMixin
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

_MAIN = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
  sha256 TEXT NOT NULL, purpose TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS vector_stores (id TEXT PRIMARY KEY, name TEXT, created_at INTEGER NOT NULL,
  metadata TEXT NOT NULL DEFAULT '{}', embed_model TEXT NOT NULL, last_active_at INTEGER);
CREATE INDEX IF NOT EXISTS vs_name ON vector_stores(name);
"""
_STORE = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS vs_files (file_id TEXT PRIMARY KEY, filename TEXT NOT NULL, sha256 TEXT NOT NULL,
  status TEXT NOT NULL, attributes TEXT NOT NULL DEFAULT '{}', chunking TEXT NOT NULL, usage_bytes INTEGER NOT NULL,
  chunks INTEGER NOT NULL DEFAULT 0, last_error TEXT, created_at INTEGER NOT NULL,
  batch_id TEXT, attempts INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS chunks (id INTEGER PRIMARY KEY, file_id TEXT NOT NULL, idx INTEGER NOT NULL,
  text TEXT NOT NULL, start INTEGER NOT NULL, "end" INTEGER NOT NULL, tokens INTEGER NOT NULL,
  hash TEXT NOT NULL, vector BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_file ON chunks(file_id);
CREATE INDEX IF NOT EXISTS chunks_hash ON chunks(hash);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(text, tokenize='porter unicode61');
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL,
  cancelled INTEGER NOT NULL DEFAULT 0);
"""
VS_FILE_COLUMNS = ("file_id, filename, sha256, status, attributes, chunking, usage_bytes, chunks, last_error, "
                   "created_at, batch_id, attempts")
Progress = Callable[[int], None]


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.row_factory = sqlite3.Row
    return con


_TX_LOCK = threading.RLock()   # one writer per process at a time; SQLite's lock orders processes


@contextlib.contextmanager
def _tx(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    with _TX_LOCK:
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}" if prefix == "file" else f"{prefix}_{uuid.uuid4().hex[:24]}"


class RagStore(JobsMixin):
    """Thread-safe for the server: one lock per operation kind; SQLite serialises writers."""

    def __init__(self, root: Path, embedder: Callable[[], Any]) -> None:
        self.root = Path(root)
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        (self.root / "stores").mkdir(parents=True, exist_ok=True)
        self._embedder = embedder              # called lazily: loading the model is not free
        self.main = _connect(self.root / "rag.sqlite")
        self.main.executescript(_MAIN)
        self._stores: dict[str, sqlite3.Connection] = {}
        self._dense: dict[str, DenseIndex] = {}
        self._touched: dict[str, int] = {}
        self._lock = _TX_LOCK
        self.worker: Any = None                 # rag/jobs.IngestWorker, in a server
        self._sweep_orphans()

    # ---- files ----------------------------------------------------------------
    def add_file(self, filename: str, data: bytes, purpose: str = "assistants") -> dict[str, Any]:
        """Validate (parse) first, then store the bytes, then the row: a refused file leaves no trace."""
        parse(filename, data)
        fid = _new_id("file")
        path = self.root / "files" / fid
        tmp = path.with_name(f".{fid}.tmp")
        with Path(tmp).open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(path)
        row = (fid, filename, len(data), hashlib.sha256(data).hexdigest(), purpose, int(time.time()))
        with _tx(self.main) as con:
            con.execute("INSERT INTO files VALUES (?,?,?,?,?,?)", row)
        return self.file(fid)

    def file(self, fid: str) -> dict[str, Any]:
        r = self.main.execute("SELECT * FROM files WHERE id=?", (fid,)).fetchone()
        if r is None:
            raise NotFound(f"No such file: {fid!r}", param="file_id")
        return {"id": r["id"], "object": "file", "bytes": r["bytes"], "created_at": r["created_at"],
                "filename": r["filename"], "purpose": r["purpose"], "status": "processed", "expires_at": None,
                "status_details": None}

    def files(self) -> list[dict[str, Any]]:
        ids = [r[0] for r in self.main.execute("SELECT id FROM files ORDER BY created_at DESC, id")]
        return [self.file(i) for i in ids]

    def file_bytes(self, fid: str) -> bytes:
        self.file(fid)
        return (self.root / "files" / fid).read_bytes()

    def delete_file(self, fid: str) -> dict[str, Any]:
        self.file(fid)
        for vs in self.vector_stores():
            with contextlib.suppress(NotFound):
                self.remove_file(vs["id"], fid)
        with _tx(self.main) as con:
            con.execute("DELETE FROM files WHERE id=?", (fid,))
        (self.root / "files" / fid).unlink(missing_ok=True)
        return {"id": fid, "object": "file", "deleted": True}

    def _sweep_orphans(self) -> None:
        """Bytes whose row never committed (a crash between the two) and half-written temp files."""
        known = {r[0] for r in self.main.execute("SELECT id FROM files")}
        old = time.time() - 3600          # another process may be between its write and its commit
        for p in (self.root / "files").iterdir():
            if (p.name.startswith(".") or p.name not in known) and p.stat().st_mtime < old:
                p.unlink(missing_ok=True)

    # ---- vector stores ------------------------------------------------------------
    def create_store(self, name: str | None, metadata: dict[str, Any] | None, embed_model: str) -> dict[str, Any]:
        vid = _new_id("vs")
        now = int(time.time())
        with _tx(self.main) as con:
            con.execute("INSERT INTO vector_stores VALUES (?,?,?,?,?,?)",
                        (vid, name, now, json.dumps(metadata or {}), embed_model, now))
        self._store(vid)
        return self.vector_store(vid)

    def find_store(self, name: str) -> str | None:
        """A vector store id by id or by name (the CLI's --store)."""
        r = self.main.execute("SELECT id FROM vector_stores WHERE id=? OR name=? ORDER BY created_at LIMIT 1",
                              (name, name)).fetchone()
        return r[0] if r else None

    def _row(self, vid: str, param: str = "vector_store_id") -> sqlite3.Row:
        r = self.main.execute("SELECT * FROM vector_stores WHERE id=?", (vid,)).fetchone()
        if r is None:
            raise NotFound(f"No vector store found with id {vid!r}", param=param)
        return r  # type: ignore[no-any-return]

    def vector_store(self, vid: str) -> dict[str, Any]:
        r = self._row(vid)
        con = self._store(vid)
        counts = dict.fromkeys(("in_progress", "completed", "failed", "cancelled"), 0)
        for status, n in con.execute("SELECT status, count(*) FROM vs_files GROUP BY status"):
            counts[status] = n
        usage = con.execute("SELECT coalesce(sum(usage_bytes),0) FROM vs_files").fetchone()[0]
        return {"id": vid, "object": "vector_store", "created_at": r["created_at"], "name": r["name"],
                "usage_bytes": usage, "file_counts": {**counts, "total": sum(counts.values())},
                "status": "in_progress" if counts["in_progress"] else "completed", "expires_after": None,
                "expires_at": None, "last_active_at": r["last_active_at"], "metadata": json.loads(r["metadata"]),
                "embedding_model": r["embed_model"]}

    def vector_stores(self) -> list[dict[str, Any]]:
        ids = [r[0] for r in self.main.execute("SELECT id FROM vector_stores ORDER BY created_at DESC, id")]
        return [self.vector_store(i) for i in ids]

    def delete_store(self, vid: str) -> dict[str, Any]:
        self._row(vid)
        with self._lock:
            con = self._stores.pop(vid, None)
            if con is not None:
                con.close()
            self._dense.pop(vid, None)
            with _tx(self.main) as m:
                m.execute("DELETE FROM vector_stores WHERE id=?", (vid,))
            for suffix in ("", "-wal", "-shm"):
                (self.root / "stores" / f"{vid}.sqlite{suffix}").unlink(missing_ok=True)
        return {"id": vid, "object": "vector_store.deleted", "deleted": True}

    def _store(self, vid: str) -> sqlite3.Connection:
        with self._lock:
            con = self._stores.get(vid)
            if con is None:
                con = _connect(self.root / "stores" / f"{vid}.sqlite")
                con.executescript(_STORE)
                con.execute("INSERT OR IGNORE INTO meta VALUES ('generation', '0')")
                _migrate(con)
                self._stores[vid] = con
            return con

    # ---- files in a vector store ----------------------------------------------------
    def vs_file(self, vid: str, fid: str) -> dict[str, Any]:
        self._row(vid)
        r = self._store(vid).execute("SELECT * FROM vs_files WHERE file_id=?", (fid,)).fetchone()
        if r is None:
            raise NotFound(f"No file {fid!r} in vector store {vid!r}", param="file_id")
        return _vs_file_json(vid, r)

    def vs_files(self, vid: str, status: str | None = None) -> list[dict[str, Any]]:
        self._row(vid)
        q = "SELECT * FROM vs_files" + (" WHERE status=?" if status else "") + " ORDER BY created_at DESC, file_id"
        return [_vs_file_json(vid, r) for r in self._store(vid).execute(q, (status,) if status else ())]

    def add_to_store(self, vid: str, fid: str, *, attributes: dict[str, Any] | None = None,
                     max_tokens: int = 200, overlap: int = 40, replace_same_name: bool = False,
                     progress: Progress | None = None, attempt: int | None = None) -> dict[str, Any] | None:
        """Parse, chunk, embed (reusing vectors of unchanged chunks), then commit in one transaction.

        ``attempt`` (the background worker): commit only if the file is still ``in_progress``
        under that attempt number when the work is done (not removed, cancelled or added again
        meanwhile: a new add resets it to 0); else write nothing and return None.
        """
        self._row(vid)
        f = self.main.execute("SELECT * FROM files WHERE id=?", (fid,)).fetchone()
        if f is None:
            raise NotFound(f"No such file: {fid!r}", param="file_id")
        con = self._store(vid)
        emb = self.check_chunking(max_tokens)
        chunking = {"type": "static", "static": {"max_chunk_size_tokens": max_tokens,
                                                 "chunk_overlap_tokens": overlap}}
        text = parse(f["filename"], self.file_bytes(fid))
        chunks = chunk_text(text, emb.tokenizer, max_tokens, overlap)
        inputs = embed_inputs(f["filename"], text, chunks)
        hashes = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in inputs]
        vectors = self._vectors(con, emb, inputs, hashes, progress)
        with _tx(con):
            row = con.execute("SELECT status, batch_id, attempts, created_at FROM vs_files WHERE file_id=?",
                              (fid,)).fetchone()
            if attempt is not None and (row is None or row["status"] != "in_progress" or row["attempts"] != attempt):
                return None
            if replace_same_name:
                for (old,) in con.execute("SELECT file_id FROM vs_files WHERE filename=? AND file_id<>?",
                                          (f["filename"], fid)).fetchall():
                    self._delete_chunks(con, old)
                    con.execute("DELETE FROM vs_files WHERE file_id=?", (old,))
            self._delete_chunks(con, fid)
            first = _next_chunk_id(con, len(chunks))
            for cid, c, h, v in zip(range(first, first + len(chunks)), chunks, hashes, vectors, strict=True):
                con.execute('INSERT INTO chunks (id, file_id, idx, text, start, "end", tokens, hash, vector) '
                            "VALUES (?,?,?,?,?,?,?,?,?)",
                            (cid, fid, c.index, c.text, c.start, c.end, c.tokens, h, v.tobytes()))
                con.execute("INSERT INTO chunks_fts(rowid, text) VALUES (?,?)", (cid, c.text))
            usage = sum(len(c.text.encode()) for c in chunks) + 4 * vectors.size
            con.execute(f"INSERT OR REPLACE INTO vs_files ({VS_FILE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        (fid, f["filename"], f["sha256"], "completed", json.dumps(attributes or {}),
                         json.dumps(chunking), usage, len(chunks), None,
                         row["created_at"] if row else int(time.time()), row["batch_id"] if row else None,
                         row["attempts"] if row else 0))
            con.execute("UPDATE meta SET value = value + 1 WHERE key='generation'")
        return self.vs_file(vid, fid)

    def check_chunking(self, max_tokens: int) -> Any:
        """The embedder, once ``max_tokens`` is known to fit it (else a 400 naming chunking_strategy)."""
        emb = self._embedder()
        if max_tokens > emb.max_tokens - 2:
            raise InvalidRequest(f"max_chunk_size_tokens {max_tokens} exceeds the embedding model's "
                                 f"{emb.max_tokens - 2}", param="chunking_strategy")
        return emb

    def _vectors(self, con: sqlite3.Connection, emb: Any, inputs: list[str], hashes: list[str],
                 progress: Progress | None) -> np.ndarray:
        """Embeddings of ``inputs``; one whose hash is already in the store reuses its vector (dedup)."""
        out = np.zeros((len(inputs), emb.dimensions), dtype=np.float32)
        todo = []
        for i, h in enumerate(hashes):
            r = con.execute("SELECT vector FROM chunks WHERE hash=? LIMIT 1", (h,)).fetchone()
            if r is not None:
                out[i] = np.frombuffer(r[0], dtype=np.float32)
            else:
                todo.append(i)
        if progress and len(todo) < len(inputs):
            progress(len(inputs) - len(todo))
        step = 64
        for s in range(0, len(todo), step):
            idx = todo[s:s + step]
            out[idx] = emb.embed_texts([inputs[i] for i in idx], truncate=True).vectors
            if progress:
                progress(len(idx))
        return out

    def _delete_chunks(self, con: sqlite3.Connection, fid: str) -> None:
        con.execute("DELETE FROM chunks_fts WHERE rowid IN (SELECT id FROM chunks WHERE file_id=?)", (fid,))
        con.execute("DELETE FROM chunks WHERE file_id=?", (fid,))

    def remove_file(self, vid: str, fid: str) -> dict[str, Any]:
        self.vs_file(vid, fid)
        con = self._store(vid)
        with _tx(con):
            self._delete_chunks(con, fid)
            con.execute("DELETE FROM vs_files WHERE file_id=?", (fid,))
            con.execute("UPDATE meta SET value = value + 1 WHERE key='generation'")
        return {"id": fid, "object": "vector_store.file.deleted", "deleted": True}

    def ingest_path(self, vid: str, path: Path, name: str, *, max_tokens: int = 200, overlap: int = 40,
                    progress: Progress | None = None) -> str:
        """A local file into a store, by name: 'unchanged' (same SHA-256), 'added' or 'replaced'.

        Re-running after a crash finds the file missing (or its old version) and does it again;
        bytes of a file row left by the crash are reused, not duplicated.
        """
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        con = self._store(vid)
        old = con.execute("SELECT file_id, sha256 FROM vs_files WHERE filename=? AND status='completed'",
                          (name,)).fetchall()
        if any(r["sha256"] == sha for r in old):
            return "unchanged"
        known = self.main.execute("SELECT id FROM files WHERE filename=? AND sha256=?", (name, sha)).fetchone()
        fid = known[0] if known else self.add_file(name, data)["id"]
        self.add_to_store(vid, fid, max_tokens=max_tokens, overlap=overlap, replace_same_name=True,
                          progress=progress)
        for r in old:      # the replaced version's bytes, unless another store still uses them
            if not any(self._store(v["id"]).execute("SELECT 1 FROM vs_files WHERE file_id=?", (r["file_id"],))
                       .fetchone() for v in self.vector_stores()):
                with _tx(self.main) as m:
                    m.execute("DELETE FROM files WHERE id=?", (r["file_id"],))
                (self.root / "files" / r["file_id"]).unlink(missing_ok=True)
        return "replaced" if old else "added"

    # ---- search -----------------------------------------------------------------------
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
        with _tx(self.main) as m:
            m.execute("UPDATE vector_stores SET last_active_at=? WHERE id=?", (now, vid))

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

    def close(self) -> None:
        with self._lock:
            for con in self._stores.values():
                con.close()
            self._stores.clear()
            self.main.close()


_HEADING = re.compile(r"^#{1,6}\s+(.+)$", re.MULTILINE)


def embed_inputs(filename: str, text: str, chunks: list[Chunk]) -> list[str]:
    """What is embedded for each chunk: its file and nearest Markdown heading, then its text.

    A chunk cut from the middle of a section often lacks the words that say what it is about;
    the heading puts them back (the stored and cited text stays the chunk itself).
    """
    heads = [(m.start(), m.group(1).strip()) for m in _HEADING.finditer(text)]
    out = []
    for c in chunks:
        title = next((h for pos, h in reversed(heads) if pos <= c.start), "")
        name = filename.rsplit("/", 1)[-1]
        out.append(f"{name} - {title}\n{c.text}" if title else f"{name}\n{c.text}")
    return out


def _vs_file_json(vid: str, r: sqlite3.Row) -> dict[str, Any]:
    err = json.loads(r["last_error"]) if r["last_error"] else None
    return {"id": r["file_id"], "object": "vector_store.file", "usage_bytes": r["usage_bytes"],
            "created_at": r["created_at"], "vector_store_id": vid, "status": r["status"], "last_error": err,
            "chunking_strategy": json.loads(r["chunking"]), "attributes": json.loads(r["attributes"]),
            "filename": r["filename"], "chunks": r["chunks"]}


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

    Chunk ids are never reused (_next_chunk_id), so new chunks are those with id > old's last,
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


def _next_chunk_id(con: sqlite3.Connection, n: int) -> int:
    """The first of ``n`` fresh chunk ids (inside the writer's transaction). Ids are never reused,
    not even those of deleted chunks, so that an in-memory index can tell new chunks by id."""
    r = con.execute("SELECT value FROM meta WHERE key='next_chunk_id'").fetchone()
    top = con.execute("SELECT coalesce(max(id), 0) + 1 FROM chunks").fetchone()[0]
    first = max(int(r[0]) if r else 0, int(top))
    con.execute("INSERT OR REPLACE INTO meta VALUES ('next_chunk_id', ?)", (str(first + n),))
    return first


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


def _migrate(con: sqlite3.Connection) -> None:
    """Stores written before background processing lack vs_files.batch_id/attempts."""
    have = {r[1] for r in con.execute("PRAGMA table_info(vs_files)")}
    if "batch_id" not in have:
        with _tx(con):
            con.execute("ALTER TABLE vs_files ADD COLUMN batch_id TEXT")
            con.execute("ALTER TABLE vs_files ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0")
