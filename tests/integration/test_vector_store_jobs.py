"""Files added to vector stores are processed in the background: the openai client's view.

OpenAI's behaviour: the add answers at once with ``in_progress``; the SDK's
``create_and_poll``/``upload_and_poll`` poll until ``completed``/``failed``; a batch can be
cancelled; a server restart resumes what was left in progress.
"""

from __future__ import annotations

import io
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from tests.servers import ServerThread


def _doc(tag: str, paragraphs: int = 2) -> bytes:
    return "\n\n".join(f"Paragraph {i} of the {tag} notes: the {tag} keyword appears here with some filler text "
                       f"about nothing in particular, number {i}." for i in range(paragraphs)).encode()


def _client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def srv(tiny_model: Path, embedding_model: Path, tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(tiny_model, rag_dir=tmp_path_factory.mktemp("rag-jobs")) as s:
        yield s


def test_add_answers_in_progress_and_polls_to_completed(srv: ServerThread) -> None:
    client = _client(srv)
    vs = client.vector_stores.create(name="jobs")
    f = client.files.create(file=("kiwi.txt", io.BytesIO(_doc("kiwi"))), purpose="assistants")
    raw = client.vector_stores.files.with_raw_response.create(vector_store_id=vs.id, file_id=f.id)
    first = raw.parse()
    assert first.status == "in_progress" and first.last_error is None
    assert raw.headers["openai-poll-after-ms"] == "200"          # paces the SDK's pollers
    done = client.vector_stores.files.poll(f.id, vector_store_id=vs.id)
    assert done.status == "completed" and done.usage_bytes > 0
    got = client.vector_stores.retrieve(vs.id)
    assert got.status == "completed" and got.file_counts.completed == 1 and got.file_counts.in_progress == 0
    assert client.vector_stores.search(vector_store_id=vs.id, query="kiwi keyword").data[0].filename == "kiwi.txt"


def test_store_created_with_file_ids_processes_them(srv: ServerThread) -> None:
    client = _client(srv)
    ids = [client.files.create(file=(f"{t}.md", io.BytesIO(_doc(t))), purpose="assistants").id
           for t in ("mango", "papaya")]
    vs = client.vector_stores.create(name="with-files", file_ids=ids)
    assert vs.file_counts.total == 2
    for fid in ids:
        assert client.vector_stores.files.poll(fid, vector_store_id=vs.id).status == "completed"
    assert client.vector_stores.retrieve(vs.id).file_counts.completed == 2


def test_file_batch_create_and_poll_and_upload_and_poll(srv: ServerThread, tmp_path: Path) -> None:
    client = _client(srv)
    vs = client.vector_stores.create(name="batches")
    ids = [client.files.create(file=(f"{t}.txt", io.BytesIO(_doc(t))), purpose="assistants").id
           for t in ("walnut", "almond")]
    b = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=vs.id, files=[{"file_id": ids[0], "attributes": {"nut": "walnut"}},
                                      {"file_id": ids[1], "attributes": {"nut": "almond"}}])
    assert b.status == "completed" and b.object == "vector_store.files_batch"
    assert (b.file_counts.completed, b.file_counts.total, b.file_counts.in_progress) == (2, 2, 0)
    listed = client.vector_stores.file_batches.list_files(b.id, vector_store_id=vs.id)
    assert sorted(f.attributes["nut"] for f in listed.data) == ["almond", "walnut"]
    hits = client.vector_stores.search(vector_store_id=vs.id, query="keyword",
                                       filters={"type": "eq", "key": "nut", "value": "almond"})
    assert hits.data and {h.filename for h in hits.data} == {"almond.txt"}
    paths = []
    for t in ("cashew", "pecan"):
        (tmp_path / f"{t}.md").write_bytes(_doc(t))
        paths.append((tmp_path / f"{t}.md").open("rb"))
    up = client.vector_stores.file_batches.upload_and_poll(vector_store_id=vs.id, files=paths)
    assert up.status == "completed" and up.file_counts.completed == 2
    assert client.vector_stores.retrieve(vs.id).file_counts.completed == 4


def test_cancel_a_batch(srv: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    from ortserve.server.rag_access import open_rag

    # The worker waits for the cancel before it looks at a file: the cancel lands before any
    # file is done on every machine (a fast worker could finish all five before it, a slow one none).
    rag, cancelled = open_rag(srv.state), threading.Event()
    process = rag.process

    def after_the_cancel(vid: str, fid: str, stop: threading.Event | None = None) -> None:
        cancelled.wait(120)
        process(vid, fid, stop)

    monkeypatch.setattr(rag, "process", after_the_cancel)
    client = _client(srv)
    vs = client.vector_stores.create(name="cancel")
    ids = [client.files.create(file=(f"c{i}.txt", io.BytesIO(_doc(f"cancelword{i}", 12))), purpose="assistants").id
           for i in range(5)]
    b = client.vector_stores.file_batches.create(vector_store_id=vs.id, file_ids=ids)
    c = client.vector_stores.file_batches.cancel(b.id, vector_store_id=vs.id)
    cancelled.set()
    assert c.status == "cancelled"
    deadline = time.monotonic() + 120
    while c.file_counts.in_progress and time.monotonic() < deadline:
        time.sleep(0.2)
        c = client.vector_stores.file_batches.retrieve(b.id, vector_store_id=vs.id)
    counts = c.file_counts
    assert counts.in_progress == 0 and counts.cancelled >= 1 and counts.completed + counts.cancelled == 5
    cancelled = client.vector_stores.file_batches.list_files(b.id, vector_store_id=vs.id, filter="cancelled")
    assert len(cancelled.data) == counts.cancelled
    gone = {f.filename for f in cancelled.data}
    hits = client.vector_stores.search(vector_store_id=vs.id, query="cancelword4 keyword", max_num_results=50)
    assert not gone & {h.filename for h in hits.data}                  # nothing of a cancelled file is searchable


def test_batch_bad_requests(srv: ServerThread) -> None:
    client = _client(srv)
    vs = client.vector_stores.create(name="bad")
    fid = client.files.create(file=("ok.txt", io.BytesIO(_doc("ok"))), purpose="assistants").id
    for kwargs, param in (({"file_ids": [fid], "files": [{"file_id": fid}]}, "file_ids"),
                          ({}, "file_ids"),
                          ({"files": [{"file_id": fid}], "attributes": {"a": "b"}}, "attributes")):
        with pytest.raises(openai.BadRequestError) as e:
            client.vector_stores.file_batches.create(vector_store_id=vs.id, **kwargs)
        assert e.value.body["param"] == param
    with pytest.raises(openai.NotFoundError) as nf:
        client.vector_stores.file_batches.create(vector_store_id=vs.id, file_ids=[fid, "file-nope"])
    assert nf.value.body["param"] == "file_ids"
    assert client.vector_stores.retrieve(vs.id).file_counts.total == 0           # nothing was queued
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.file_batches.retrieve("vsfb_nope", vector_store_id=vs.id)
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.file_batches.cancel("vsfb_nope", vector_store_id=vs.id)


def test_files_left_in_progress_are_resumed_by_the_next_server(tiny_model: Path, embedding_model: Path,
                                                               tmp_path: Path) -> None:
    rag_dir = tmp_path / "rag"
    with ServerThread(tiny_model, rag_dir=rag_dir) as a:
        client = _client(a)
        vs = client.vector_stores.create(name="restart")
        rag = a.state.rag
        process = rag.process

        def slow(vid: str, fid: str, stop=None):  # a file that takes until the server stops, on any machine
            stop.wait(30)
            process(vid, fid, stop=stop)

        rag.process = slow
        ids = [client.files.create(file=(f"r{i}.txt", io.BytesIO(_doc(f"restart{i}", 12))),
                                   purpose="assistants").id for i in range(4)]
        b = client.vector_stores.file_batches.create(vector_store_id=vs.id, file_ids=ids)
    # server a stopped with files queued: they are still in_progress on disk
    con = sqlite3.connect(rag_dir / "stores" / f"{vs.id}.sqlite")
    left = con.execute("SELECT count(*) FROM vs_files WHERE status='in_progress'").fetchone()[0]
    con.close()
    assert left >= 1
    with ServerThread(tiny_model, rag_dir=rag_dir) as b_srv:
        done = _client(b_srv).vector_stores.file_batches.poll(b.id, vector_store_id=vs.id)
        assert done.status == "completed" and done.file_counts.completed == 4
        hits = _client(b_srv).vector_stores.search(vector_store_id=vs.id, query="restart3 keyword")
        assert hits.data[0].filename == "r3.txt"


def test_cancel_refuses_a_body_it_would_ignore(srv: ServerThread) -> None:
    """The cancel route takes no body: fields sent to it are refused by name, never ignored."""
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/v1/vector_stores/vs_x/file_batches/vsfb_x/cancel", json={"reason": "no"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "body"
        r = c.post("/v1/vector_stores/vs_x/file_batches/vsfb_x/cancel", json={})
        assert r.status_code == 404  # an empty object is no body: the unknown store is what is wrong
