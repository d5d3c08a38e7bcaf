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

``RagStore`` is this module (files, vector stores, ingestion) plus two mixins: search
(``rag/retrieval.py``) and background processing (``rag/jobs.py``); the SQLite layout and the
writer transaction they share are ``rag/schema.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from ortserve import faults
from ortserve.errors import InvalidRequest, NotFound, StorageFull, disk_full
from ortserve.models.store import fsync_dir
from ortserve.rag.ingest import Chunk, chunk_text, parse
from ortserve.rag.jobs import JobsMixin
from ortserve.rag.retrieval import SearchMixin
from ortserve.rag.schema import (
    MAIN_SCHEMA,
    STORE_SCHEMA,
    VS_FILE_COLUMNS,
    connect,
    migrate,
    new_id,
    next_chunk_id,
    tx,
)
from ortserve.rag.schema import TX_LOCK as _TX_LOCK  # server/api/files.py takes it from here
from ortserve.rag.search import DenseIndex

Progress = Callable[[int], None]
_UPLOAD_TMP = re.compile(r"^\.(file-[0-9a-f]+)\.(\d+)\.tmp$")


class RagStore(SearchMixin, JobsMixin):
    """Thread-safe for the server: one lock per operation kind; SQLite serialises writers."""

    def __init__(self, root: Path, embedder: Callable[[], Any]) -> None:
        self.root = Path(root)
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        (self.root / "stores").mkdir(parents=True, exist_ok=True)
        self._embedder = embedder              # called lazily: loading the model is not free
        self.main = connect(self.root / "rag.sqlite")
        self.main.executescript(MAIN_SCHEMA)
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
        fid = new_id("file")
        path = self.root / "files" / fid
        # bytes (fsynced) in a temp file named by its writer, then the row, then the rename: a kill
        # before the commit leaves a temp file the next start deletes, after it one it renames
        tmp = path.with_name(f".{fid}.{os.getpid()}.tmp")
        try:
            with Path(tmp).open("wb") as f:
                f.write(data[:len(data) // 2])
                faults.point("rag.upload.partial")
                f.write(data[len(data) // 2:])
                f.flush()
                os.fsync(f.fileno())
            faults.point("rag.upload.written")
            row = (fid, filename, len(data), hashlib.sha256(data).hexdigest(), purpose, int(time.time()))
            with tx(self.main) as con:
                con.execute("INSERT INTO files VALUES (?,?,?,?,?,?)", row)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if disk_full(exc):
                raise StorageFull(f"disk full: {filename} was not stored", param="file",
                                  hint=f"free space under {self.root}") from exc
            raise
        faults.point("rag.upload.row")
        Path(tmp).replace(path)
        fsync_dir(path.parent)
        faults.point("rag.upload.committed")
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
        with tx(self.main) as con:
            con.execute("DELETE FROM files WHERE id=?", (fid,))
        (self.root / "files" / fid).unlink(missing_ok=True)
        return {"id": fid, "object": "file", "deleted": True}

    def _sweep_orphans(self) -> None:
        """Temp files of uploads whose writer is gone: renamed into place if their row committed (the
        bytes were fsynced first), else deleted. Other stray bytes once they are an hour old."""
        known = {r[0] for r in self.main.execute("SELECT id FROM files")}
        old = time.time() - 3600          # another process may be between its write and its commit
        for p in (self.root / "files").iterdir():
            m = _UPLOAD_TMP.match(p.name)
            if m is not None:
                fid, pid = m.group(1), int(m.group(2))
                if pid == os.getpid() or psutil.pid_exists(pid):
                    continue              # still being written (a live process, this one included)
                if fid in known and not (p.parent / fid).exists():
                    p.replace(p.parent / fid)
                    fsync_dir(p.parent)
                else:
                    p.unlink(missing_ok=True)
            elif (p.name.startswith(".") or p.name not in known) and p.stat().st_mtime < old:
                p.unlink(missing_ok=True)

    # ---- vector stores ------------------------------------------------------------
    def create_store(self, name: str | None, metadata: dict[str, Any] | None, embed_model: str) -> dict[str, Any]:
        vid = new_id("vs")
        now = int(time.time())
        with tx(self.main) as con:
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
            self._touched.pop(vid, None)   # else one entry per store ever searched, for the server's life
            with tx(self.main) as m:
                m.execute("DELETE FROM vector_stores WHERE id=?", (vid,))
            for suffix in ("", "-wal", "-shm"):
                (self.root / "stores" / f"{vid}.sqlite{suffix}").unlink(missing_ok=True)
        return {"id": vid, "object": "vector_store.deleted", "deleted": True}

    def _store(self, vid: str) -> sqlite3.Connection:
        with self._lock:
            con = self._stores.get(vid)
            if con is None:
                self._row(vid)   # deleted since the caller looked: 404, never a new empty file in its place
                con = connect(self.root / "stores" / f"{vid}.sqlite")
                con.executescript(STORE_SCHEMA)
                con.execute("INSERT OR IGNORE INTO meta VALUES ('generation', '0')")
                migrate(con)
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
        faults.point("rag.ingest.embedded")
        with tx(con):
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
            first = next_chunk_id(con, len(chunks))
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
            faults.point("rag.ingest.commit")
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
        with tx(con):
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
                with tx(self.main) as m:
                    m.execute("DELETE FROM files WHERE id=?", (r["file_id"],))
                (self.root / "files" / r["file_id"]).unlink(missing_ok=True)
        return "replaced" if old else "added"

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
