"""Background processing of files added to vector stores, as OpenAI does it.

``POST /v1/vector_stores/{id}/files`` (and ``file_batches``) only records the file as
``in_progress`` and queues it; one worker thread per server parses, chunks and embeds it, then
commits it (``completed``) or records why not (``failed`` with ``last_error``). The queue is
the ``in_progress`` rows themselves: a server that stops or is killed leaves them there, and
the next server resumes them at start. A file whose processing was interrupted
``MAX_ATTEMPTS`` times (a file that kills the server, say) is marked failed instead of being
retried forever.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections import deque
from typing import Any

from ortserve import faults
from ortserve.errors import InvalidRequest, NotFound, Overloaded, disk_full
from ortserve.rag.ingest import UnsupportedFile
from ortserve.rag.schema import VS_FILE_COLUMNS, tx

log = logging.getLogger("ortserve.rag")
MAX_ATTEMPTS = 3
Job = tuple[str, str]           # (vector store id, file id)


class Stopped(Exception):
    """The worker is stopping, or the file's batch was cancelled: leave the file as it is."""


class JobsMixin:
    """The RagStore side of background processing: queue rows, process one, batches, cancel."""

    # provided by RagStore
    main: Any
    _row: Any
    _store: Any
    add_to_store: Any
    vs_file: Any
    vector_stores: Any

    def enqueue_file(self, vid: str, fid: str, *, attributes: dict[str, Any] | None, max_tokens: int,
                     overlap: int, batch_id: str | None = None) -> dict[str, Any]:
        """Record ``fid`` as in_progress in the store (its old chunks stay searchable until replaced)."""
        self._row(vid)
        f = self.main.execute("SELECT filename, sha256 FROM files WHERE id=?", (fid,)).fetchone()
        if f is None:
            raise NotFound(f"No such file: {fid!r}", param="file_id")
        con = self._store(vid)
        chunking = {"type": "static", "static": {"max_chunk_size_tokens": max_tokens,
                                                 "chunk_overlap_tokens": overlap}}
        with tx(con):
            old = con.execute("SELECT usage_bytes, chunks FROM vs_files WHERE file_id=?", (fid,)).fetchone()
            con.execute(f"INSERT OR REPLACE INTO vs_files ({VS_FILE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        (fid, f["filename"], f["sha256"], "in_progress", json.dumps(attributes or {}),
                         json.dumps(chunking), old["usage_bytes"] if old else 0, old["chunks"] if old else 0,
                         None, int(time.time()), batch_id, 0))
        faults.point("rag.enqueued")
        return self.vs_file(vid, fid)  # type: ignore[no-any-return]

    def pending(self) -> list[Job]:
        """Every in_progress file of every store, oldest first (what a starting server resumes)."""
        jobs = []
        for vs in self.vector_stores():
            con = self._store(vs["id"])
            jobs += [(r[1], vs["id"], r[0]) for r in
                     con.execute("SELECT file_id, created_at FROM vs_files WHERE status='in_progress'")]
        return [(vid, fid) for _, vid, fid in sorted(jobs)]

    def process(self, vid: str, fid: str, stop: threading.Event | None = None) -> None:
        """Do one queued file: completed, failed with last_error, or untouched (removed/cancelled/stopped)."""
        try:
            self._row(vid)
        except NotFound:
            return                                  # the store was deleted while the file waited
        con = self._store(vid)
        with tx(con):
            r = con.execute("SELECT * FROM vs_files WHERE file_id=?", (fid,)).fetchone()
            if r is None or r["status"] != "in_progress":
                return
            con.execute("UPDATE vs_files SET attempts = attempts + 1 WHERE file_id=?", (fid,))
        if r["attempts"] >= MAX_ATTEMPTS:
            self._fail(vid, fid, "server_error", f"processing this file was interrupted {r['attempts']} times "
                                                 "(the server stopped or was killed while embedding it)")
            return
        static = json.loads(r["chunking"])["static"]

        def progress(_: int) -> None:
            if stop is not None and stop.is_set():
                raise Stopped

        try:
            self.add_to_store(vid, fid, attributes=json.loads(r["attributes"]),
                              max_tokens=static["max_chunk_size_tokens"], overlap=static["chunk_overlap_tokens"],
                              progress=progress, attempt=r["attempts"] + 1)
        except Stopped:
            with tx(con):      # not the file's fault: this attempt does not count
                con.execute("UPDATE vs_files SET attempts = max(attempts - 1, 0) WHERE file_id=? AND attempts=?",
                            (fid, r["attempts"] + 1))
        except NotFound as exc:   # the file was deleted meanwhile: its rows went with it
            self._fail(vid, fid, "invalid_file", exc.message)
        except UnsupportedFile as exc:
            self._fail(vid, fid, "unsupported_file", exc.message)
        except InvalidRequest as exc:
            self._fail(vid, fid, "invalid_file", exc.message)
        except Exception as exc:  # recorded on the file, for the client to read
            if self._gone(vid):   # the store was deleted meanwhile (its connection closed under us): its rows went with it
                return
            if disk_full(exc):
                log.error("processing %s in %s: the disk is full", fid, vid)
                self._fail(vid, fid, "server_error", f"the disk is full; nothing of this file was stored ({exc})")
                return
            log.exception("processing %s in %s failed", fid, vid)
            self._fail(vid, fid, "server_error", f"{type(exc).__name__}: {exc}")

    def _gone(self, vid: str) -> bool:
        try:
            self._row(vid)
        except NotFound:
            return True
        return False

    def _fail(self, vid: str, fid: str, code: str, message: str) -> None:
        with contextlib.suppress(NotFound):
            self._row(vid)
            con = self._store(vid)
            with tx(con):
                con.execute("UPDATE vs_files SET status='failed', last_error=? WHERE file_id=? AND status='in_progress'",
                            (json.dumps({"code": code, "message": message}), fid))

    # ---- batches ------------------------------------------------------------------
    def create_batch(self, vid: str, files: list[tuple[str, dict[str, Any] | None, int, int]]) -> dict[str, Any]:
        """A batch row, then each (file id, attributes, max tokens, overlap) queued under it."""
        self._row(vid)
        for fid, *_ in files:     # 404 before anything is recorded
            if self.main.execute("SELECT 1 FROM files WHERE id=?", (fid,)).fetchone() is None:
                raise NotFound(f"No such file: {fid!r}", param="file_ids")
        bid = f"vsfb_{uuid.uuid4().hex[:24]}"
        con = self._store(vid)
        with tx(con):
            con.execute("INSERT INTO batches (id, created_at) VALUES (?,?)", (bid, int(time.time())))
        for fid, attrs, size, overlap in files:
            self.enqueue_file(vid, fid, attributes=attrs, max_tokens=size, overlap=overlap, batch_id=bid)
        return self.batch(vid, bid)

    def batch(self, vid: str, bid: str) -> dict[str, Any]:
        self._row(vid)
        con = self._store(vid)
        b = con.execute("SELECT * FROM batches WHERE id=?", (bid,)).fetchone()
        if b is None:
            raise NotFound(f"No file batch {bid!r} in vector store {vid!r}", param="batch_id")
        counts = dict.fromkeys(("in_progress", "completed", "failed", "cancelled"), 0)
        for status, n in con.execute("SELECT status, count(*) FROM vs_files WHERE batch_id=? GROUP BY status",
                                     (bid,)):
            counts[status] = n
        total = sum(counts.values())
        if b["cancelled"]:
            status = "cancelled"
        elif counts["in_progress"]:
            status = "in_progress"
        elif total and counts["failed"] == total:
            status = "failed"
        else:
            status = "completed"
        return {"id": bid, "object": "vector_store.files_batch", "created_at": b["created_at"],
                "vector_store_id": vid, "status": status, "file_counts": {**counts, "total": total}}

    def batch_files(self, vid: str, bid: str, status: str | None = None) -> list[dict[str, Any]]:
        self.batch(vid, bid)
        con = self._store(vid)
        q = "SELECT file_id FROM vs_files WHERE batch_id=?" + (" AND status=?" if status else "")
        return [self.vs_file(vid, r[0]) for r in con.execute(q, (bid, status) if status else (bid,)).fetchall()]

    def cancel_batch(self, vid: str, bid: str) -> dict[str, Any]:
        """Files of the batch not yet done become ``cancelled``; one being embedded is dropped at commit."""
        self.batch(vid, bid)
        con = self._store(vid)
        with tx(con):
            con.execute("UPDATE batches SET cancelled=1 WHERE id=?", (bid,))
            con.execute("UPDATE vs_files SET status='cancelled' WHERE batch_id=? AND status='in_progress'", (bid,))
        return self.batch(vid, bid)


class IngestWorker:
    """One thread per server that processes queued files in order; the queue is bounded."""

    def __init__(self, rag: Any, max_queued: int) -> None:
        self.rag = rag
        self.max_queued = max_queued
        self._jobs: deque[Job] = deque()
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current: Job | None = None

    def start(self) -> None:
        """Resume what an earlier server left in_progress, then wait for work."""
        with self._cv:
            self._jobs.extend(self.rag.pending())
        if self._jobs:
            log.info("resuming %d file(s) left in progress", len(self._jobs))
        self._thread = threading.Thread(target=self._run, name="rag-ingest", daemon=True)
        self._thread.start()

    def room(self, n: int) -> None:
        """Raise 429 if ``n`` more files would overflow the queue (checked before anything is recorded)."""
        with self._cv:
            if len(self._jobs) + n > self.max_queued:
                raise Overloaded(f"{len(self._jobs)} files are waiting to be processed; this server queues at "
                                 f"most {self.max_queued} (ORTSERVE_RAG_QUEUE_SIZE). Retry when they are done",
                                 param="file_id")

    def submit(self, jobs: list[Job]) -> None:
        with self._cv:
            self._jobs.extend(jobs)
            self._cv.notify()

    def queued(self) -> int:
        with self._cv:
            return len(self._jobs)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                while not self._jobs and not self._stop.is_set():
                    self._cv.wait()
                if self._stop.is_set():
                    return
                self.current = self._jobs.popleft()
            try:
                self.rag.process(*self.current, stop=self._stop)
            except Exception:  # the worker must outlive any one file
                log.exception("rag worker: %s", self.current)
            finally:
                self.current = None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the current embedding batch; unfinished files stay in_progress for the next start."""
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
