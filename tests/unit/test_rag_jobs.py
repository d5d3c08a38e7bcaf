"""Background processing of vector-store files (rag/jobs.py) without a model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.unit.test_rag_search import BagOfWords

from ortserve.errors import NotFound, Overloaded
from ortserve.rag.index import RagStore
from ortserve.rag.jobs import MAX_ATTEMPTS, IngestWorker


class Hooked(BagOfWords):
    """Calls ``hook`` before each embedding call (to cancel, delete or fail mid-file)."""

    def __init__(self) -> None:
        self.hook: Any = None

    def embed_texts(self, texts: list[str], truncate: bool = False) -> Any:
        if self.hook is not None:
            self.hook()
        return super().embed_texts(texts, truncate)


@pytest.fixture()
def env(tmp_path: Path) -> tuple[RagStore, str, Hooked]:
    emb = Hooked()
    rag = RagStore(tmp_path, lambda: emb)
    vid = rag.create_store("t", None, "bow")["id"]
    yield rag, vid, emb
    rag.close()


def _file(rag: RagStore, name: str, words: str = "alpha beta gamma") -> str:
    return rag.add_file(name, f"{words} in {name}.\n\nMore {words}.".encode())["id"]


def test_queued_file_is_in_progress_then_completed(env: tuple[RagStore, str, Hooked]) -> None:
    rag, vid, _ = env
    fid = _file(rag, "a.txt")
    f = rag.enqueue_file(vid, fid, attributes={"k": "v"}, max_tokens=64, overlap=8)
    assert f["status"] == "in_progress" and f["chunks"] == 0
    assert rag.vector_store(vid)["status"] == "in_progress" and rag.pending() == [(vid, fid)]
    rag.process(vid, fid)
    f = rag.vs_file(vid, fid)
    assert f["status"] == "completed" and f["chunks"] > 0 and f["attributes"] == {"k": "v"}
    assert f["chunking_strategy"]["static"]["max_chunk_size_tokens"] == 64
    assert rag.pending() == [] and rag.vector_store(vid)["file_counts"]["completed"] == 1
    assert rag.search(vid, "alpha", k=1)[0]["file_id"] == fid


def test_an_embedding_error_fails_the_file_with_last_error(env: tuple[RagStore, str, Hooked]) -> None:
    rag, vid, emb = env
    fid = _file(rag, "a.txt")
    rag.enqueue_file(vid, fid, attributes=None, max_tokens=64, overlap=8)

    def boom() -> None:
        raise RuntimeError("the model fell over")
    emb.hook = boom
    rag.process(vid, fid)
    f = rag.vs_file(vid, fid)
    assert f["status"] == "failed" and f["last_error"]["code"] == "server_error"
    assert "the model fell over" in f["last_error"]["message"]
    emb.hook = None
    assert rag.vector_store(vid)["file_counts"]["failed"] == 1 and rag.search(vid, "alpha", k=3) == []


def test_a_file_interrupted_too_often_is_failed_not_retried(env: tuple[RagStore, str, Hooked]) -> None:
    rag, vid, _ = env
    fid = _file(rag, "a.txt")
    rag.enqueue_file(vid, fid, attributes=None, max_tokens=64, overlap=8)
    con = rag._store(vid)
    con.execute("UPDATE vs_files SET attempts=? WHERE file_id=?", (MAX_ATTEMPTS, fid))   # as after 3 kills
    rag.process(vid, fid)
    f = rag.vs_file(vid, fid)
    assert f["status"] == "failed" and f["last_error"]["code"] == "server_error"
    assert "interrupted 3 times" in f["last_error"]["message"]


def test_cancel_during_embedding_drops_the_file_and_the_rest(env: tuple[RagStore, str, Hooked]) -> None:
    rag, vid, emb = env
    done = _file(rag, "done.txt", "zeta")
    rag.add_to_store(vid, done)
    fids = [_file(rag, f"f{i}.txt", "omega") for i in range(3)]
    batch = rag.create_batch(vid, [(f, None, 64, 8) for f in fids])
    assert batch["status"] == "in_progress" and batch["file_counts"]["in_progress"] == 3
    emb.hook = lambda: rag.cancel_batch(vid, batch["id"])     # the cancel arrives while f0 is embedded
    for fid in fids:
        rag.process(vid, fid)
    b = rag.batch(vid, batch["id"])
    assert b["status"] == "cancelled" and b["file_counts"] == {"in_progress": 0, "completed": 0, "failed": 0,
                                                                "cancelled": 3, "total": 3}
    assert [h["file_id"] for h in rag.search(vid, "omega zeta", k=5)] == [done]
    assert {f["id"] for f in rag.batch_files(vid, batch["id"], "cancelled")} == set(fids)


def test_removed_while_queued_is_not_resurrected(env: tuple[RagStore, str, Hooked]) -> None:
    rag, vid, emb = env
    fid = _file(rag, "a.txt")
    rag.enqueue_file(vid, fid, attributes=None, max_tokens=64, overlap=8)
    emb.hook = lambda: rag.remove_file(vid, fid)      # removed while it is being embedded
    rag.process(vid, fid)
    with pytest.raises(NotFound):
        rag.vs_file(vid, fid)
    assert rag._store(vid).execute("SELECT count(*) FROM chunks").fetchone()[0] == 0


def test_worker_resumes_pending_files_and_bounds_its_queue(env: tuple[RagStore, str, Hooked]) -> None:
    rag, vid, _ = env
    fids = [_file(rag, f"r{i}.txt") for i in range(3)]
    for f in fids:                                     # left in_progress by a server that stopped
        rag.enqueue_file(vid, f, attributes=None, max_tokens=64, overlap=8)
    w = IngestWorker(rag, max_queued=4)
    w.start()
    try:
        deadline = time.monotonic() + 120  # the event: nothing pending; the bound only guards a hang
        while rag.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(rag.vs_file(vid, f)["status"] == "completed" for f in fids)
        w.room(4)
        with pytest.raises(Overloaded):
            w.room(5)
    finally:
        w.stop()
    assert not w._thread.is_alive()


def test_old_store_gains_the_new_columns(tmp_path: Path) -> None:
    """A store written before background processing (no batch_id/attempts) opens and works."""
    import sqlite3

    emb = BagOfWords()
    rag = RagStore(tmp_path, lambda: emb)
    vid = rag.create_store("old", None, "bow")["id"]
    rag.close()
    path = tmp_path / "stores" / f"{vid}.sqlite"
    con = sqlite3.connect(path)
    con.executescript("DROP TABLE vs_files; DROP TABLE batches; CREATE TABLE vs_files (file_id TEXT PRIMARY KEY, "
                      "filename TEXT NOT NULL, sha256 TEXT NOT NULL, status TEXT NOT NULL, attributes TEXT NOT NULL "
                      "DEFAULT '{}', chunking TEXT NOT NULL, usage_bytes INTEGER NOT NULL, chunks INTEGER NOT NULL "
                      "DEFAULT 0, last_error TEXT, created_at INTEGER NOT NULL);")
    con.close()
    rag = RagStore(tmp_path, lambda: emb)
    fid = _file(rag, "a.txt")
    rag.add_to_store(vid, fid)
    assert rag.vs_file(vid, fid)["status"] == "completed"
    assert json.loads(json.dumps(rag.search(vid, "alpha", k=1)))[0]["file_id"] == fid
    assert np.isfinite(rag.search(vid, "alpha", k=1)[0]["score"])
    rag.close()


def test_added_again_while_embedded_the_latest_request_wins(env: tuple[RagStore, str, Hooked]) -> None:
    """A file re-added (new attributes) while its first add is being embedded: the first
    result is not committed over the second request; the second job commits its own."""
    rag, vid, emb = env
    fid = _file(rag, "a.txt")
    rag.enqueue_file(vid, fid, attributes={"v": "first"}, max_tokens=64, overlap=8)

    def again() -> None:
        emb.hook = None
        rag.enqueue_file(vid, fid, attributes={"v": "second"}, max_tokens=64, overlap=8)
    emb.hook = again
    rag.process(vid, fid)
    assert rag.vs_file(vid, fid)["status"] == "in_progress"
    rag.process(vid, fid)
    f = rag.vs_file(vid, fid)
    assert f["status"] == "completed" and f["attributes"] == {"v": "second"}


def test_store_deleted_during_embedding_ends_the_job_quietly(env: tuple[RagStore, str, Hooked],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The vector store is deleted while its file is embedded (its connection closed under the job):
    the job ends with nothing written and no error logged (it was "Cannot operate on a closed
    database", logged as a failure, in the one-hour soak), and the server goes on."""
    rag, vid, emb = env
    fid = _file(rag, "a.txt")
    rag.enqueue_file(vid, fid, attributes=None, max_tokens=64, overlap=8)
    emb.hook = lambda: rag.delete_store(vid)
    rag.process(vid, fid)
    emb.hook = None
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []
    with pytest.raises(NotFound):
        rag.vector_store(vid)
    assert rag.pending() == []
    other = rag.create_store("u", None, "bow")["id"]   # and the index still works
    rag.enqueue_file(other, fid, attributes=None, max_tokens=64, overlap=8)
    rag.process(other, fid)
    assert rag.vs_file(other, fid)["status"] == "completed"
