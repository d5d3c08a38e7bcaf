"""Files + Vector Stores through the official openai client, and the bad inputs of issue 16."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import openai
import pytest
from tests.servers import ServerThread

DOCS = {
    "colours.md": "# Colours\n\nThe three primary colours of light are red, green and blue. Mixing all three "
                  "gives white light.\n\nPainters traditionally use red, yellow and blue as primaries.",
    "tea.txt": "To brew green tea, heat the water to about 80 degrees Celsius and steep the leaves for two "
               "minutes. Boiling water makes green tea bitter.",
    "castle.html": "<html><head><style>p{color:red}</style><script>var x=1;</script></head><body>"
                   "<h1>Castle</h1><p>The drawbridge of the old castle is raised every night at ten.</p>"
                   "</body></html>",
}


@pytest.fixture(scope="module")
def srv(tiny_model: Path, embedding_model: Path, tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(tiny_model, rag_dir=tmp_path_factory.mktemp("rag"), max_upload_bytes=2_000_000) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def store(client: openai.OpenAI, tmp_path_factory: pytest.TempPathFactory):
    vs = client.vector_stores.create(name="kb")
    d = tmp_path_factory.mktemp("docs")
    for name, text in DOCS.items():
        (d / name).write_text(text)
        f = client.vector_stores.files.upload_and_poll(vector_store_id=vs.id, file=(d / name).open("rb"),
                                                       attributes={"kind": Path(name).suffix[1:]})
        assert f.status == "completed", f.last_error
    return vs


def test_store_lists_counts_and_searches(client: openai.OpenAI, store) -> None:
    got = client.vector_stores.retrieve(store.id)
    assert got.name == "kb" and got.file_counts.completed == 3 and got.usage_bytes > 0
    assert store.id in [v.id for v in client.vector_stores.list()]
    files = client.vector_stores.files.list(vector_store_id=store.id)
    assert len(files.data) == 3 and all(f.status == "completed" for f in files.data)
    hits = client.vector_stores.search(vector_store_id=store.id, query="how hot should the water be for green tea?")
    assert hits.data[0].filename == "tea.txt" and "80 degrees" in hits.data[0].content[0].text
    html = client.vector_stores.search(vector_store_id=store.id, query="when is the drawbridge raised")
    assert html.data[0].filename == "castle.html"
    assert "var x" not in html.data[0].content[0].text and "color" not in html.data[0].content[0].text


def test_search_modes_and_filters(client: openai.OpenAI, store) -> None:
    q = "primary colours of light"
    for mode in ("dense", "bm25", "hybrid"):
        r = client.vector_stores.search(vector_store_id=store.id, query=q, extra_body={"search_mode": mode})
        assert r.data[0].filename == "colours.md", mode
    only_txt = client.vector_stores.search(vector_store_id=store.id, query=q, max_num_results=5,
                                           filters={"type": "eq", "key": "kind", "value": "txt"})
    assert {d.filename for d in only_txt.data} == {"tea.txt"}
    either = client.vector_stores.search(vector_store_id=store.id, query=q, filters={
        "type": "or", "filters": [{"type": "eq", "key": "kind", "value": "txt"},
                                  {"type": "eq", "key": "kind", "value": "html"}]})
    assert {d.filename for d in either.data} <= {"tea.txt", "castle.html"}
    with pytest.raises(openai.BadRequestError) as e:
        client.vector_stores.search(vector_store_id=store.id, query=q, filters={"type": "like", "key": "k",
                                                                                 "value": 1})
    assert e.value.body["param"] == "filters"


def test_changed_file_replaces_chunks_and_delete(client: openai.OpenAI, store, srv: ServerThread) -> None:
    f = client.files.create(file=("notes.txt", b"The secret word is marmalade."), purpose="assistants")
    client.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=f.id)
    hit = client.vector_stores.search(vector_store_id=store.id, query="secret word", max_num_results=1)
    assert hit.data[0].file_id == f.id
    client.vector_stores.files.delete(file_id=f.id, vector_store_id=store.id)
    hits = client.vector_stores.search(vector_store_id=store.id, query="secret word marmalade")
    assert f.id not in {d.file_id for d in hits.data}
    assert client.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)


BAD_UPLOADS = [
    ("photo.exe", b"MZ\x90\x00binary", "unsupported_file"),
    ("empty.txt", b"", "empty_file"),
    ("blank.md", b"  \n\n ", "empty_file"),
    ("image.txt", bytes(range(256)) * 4, "unsupported_file"),
    ("fake.pdf", b"not a pdf at all", "unsupported_file"),
    ("../../etc/passwd.txt", b"root:x:0:0", "invalid_file_name"),
    ("..\\win.txt", b"hello", "invalid_file_name"),
]


@pytest.mark.parametrize(("name", "data", "code"), BAD_UPLOADS)
def test_bad_uploads_are_400_and_store_intact(client: openai.OpenAI, store, srv: ServerThread,
                                              name: str, data: bytes, code: str) -> None:
    before = {f.id for f in client.files.list()}
    r = httpx.post(f"{srv.url}/v1/files", files={"file": (name, io.BytesIO(data))}, data={"purpose": "assistants"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == "file"
    assert {f.id for f in client.files.list()} == before
    assert client.vector_stores.retrieve(store.id).file_counts.completed == 3
    assert not list((srv.settings.rag_path / "files").glob(".*"))


def test_too_large_upload_is_413(client: openai.OpenAI, store, srv: ServerThread) -> None:
    big = b"word " * (10 * 1024 * 1024)     # 50 MB
    r = httpx.post(f"{srv.url}/v1/files", files={"file": ("big.txt", big)}, data={"purpose": "assistants"},
                   timeout=120)
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
    assert client.vector_stores.retrieve(store.id).file_counts.completed == 3


def test_unknown_ids_are_404(client: openai.OpenAI, store) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.vector_stores.search(vector_store_id="vs_nope", query="x")
    assert e.value.body["param"] == "vector_store_id"
    with pytest.raises(openai.NotFoundError) as e:
        client.vector_stores.files.create(vector_store_id=store.id, file_id="file-nope")
    assert e.value.body["param"] == "file_id"
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("a.txt", b"hello"), purpose="fine-tune")
    assert e.value.body["param"] == "purpose"


def test_delete_store(client: openai.OpenAI, srv: ServerThread) -> None:
    vs = client.vector_stores.create(name="scratch")
    assert client.vector_stores.delete(vs.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve(vs.id)
    assert not (srv.settings.rag_path / "stores" / f"{vs.id}.sqlite").exists()


def test_lists_paginate_and_refuse_unknown_query_parameters(client: openai.OpenAI, store,
                                                             srv: ServerThread) -> None:
    # the SDK's auto-pagination walks `after` cursors one object at a time
    walked = [f.id for f in client.vector_stores.files.list(vector_store_id=store.id, limit=1)]
    assert len(walked) == 3 == len(set(walked))
    first = client.vector_stores.files.list(vector_store_id=store.id, limit=2, order="asc")
    assert len(first.data) == 2 and first.has_more
    rest = client.vector_stores.files.list(vector_store_id=store.id, limit=2, order="asc", after=first.data[-1].id)
    assert [f.id for f in first.data + rest.data] == list(reversed(walked)) and not rest.has_more
    assert [v.id for v in client.vector_stores.list(limit=100)][:1] == [v.id for v in client.vector_stores.list(limit=1).data]
    for query, param in (("bogus=1", "bogus"), ("limit=0", "limit"), ("order=up", "order"), ("after=file-x", "after")):
        r = httpx.get(f"{srv.url}/v1/files?{query}", timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (query, r.text)
    assert all(f.purpose == "assistants" for f in client.files.list(purpose="assistants"))
