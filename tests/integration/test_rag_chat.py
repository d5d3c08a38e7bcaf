"""/v1/chat/completions with the `file_search` extension: sources in, citations out, private by default."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from router_fakes import FakeCloud
from tests.servers import ServerThread


@pytest.fixture(scope="module")
def cloud():
    fake = FakeCloud("openai", reply="Hello from the cloud").start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def srv(tiny_model: Path, embedding_model: Path, cloud: FakeCloud, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("rag-chat")
    cfg = tmp / "route.json"
    cfg.write_text(json.dumps({
        "defaultProvider": "openrouter", "fallbackChain": ["openrouter", "local"],
        "providers": {"local": {"type": "local"},
                      "openrouter": {"type": "openai-compatible", "baseUrl": cloud.url, "apiKey": "sk-test",
                                     "models": {"default": "openai/gpt-4o-mini"}}},
        "routing": {"rules": [{"condition": {"privacy": "high"}, "action": {"provider": "local"},
                               "reason": "private stays here"}]}}), encoding="utf-8")
    with ServerThread(tiny_model, rag_dir=tmp / "rag", router_config=str(cfg)) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def store(client: openai.OpenAI):
    vs = client.vector_stores.create(name="facts")
    for name, text in [("tea.txt", "Green tea should be brewed with water at 80 degrees Celsius."),
                       ("bikes.txt", "Oil a bicycle chain every 300 kilometres.")]:
        f = client.files.create(file=(name, text.encode()), purpose="assistants")
        client.vector_stores.files.create_and_poll(vector_store_id=vs.id, file_id=f.id)
    return vs


def test_answer_carries_citations(client: openai.OpenAI, store) -> None:
    r = client.chat.completions.create(model="tiny", max_tokens=8, messages=[
        {"role": "user", "content": "How hot should the water be for green tea?"}],
        extra_body={"file_search": {"vector_store_ids": [store.id], "max_num_results": 2}})
    cites = r.model_extra["citations"]
    assert cites[0]["filename"] == "tea.txt" and cites[0]["index"] == 1 and len(cites) == 2
    assert r.choices[0].message.content is not None and r.usage.prompt_tokens > 30   # the sources went in
    stream = client.chat.completions.create(model="tiny", max_tokens=4, stream=True, messages=[
        {"role": "user", "content": "bicycle chain oil"}],
        extra_body={"file_search": {"vector_store_ids": [store.id], "max_num_results": 1}})
    first = next(iter(stream))
    assert first.model_extra["citations"][0]["filename"] == "bikes.txt"


def test_store_request_stays_local_even_when_rules_pick_the_cloud(srv: ServerThread, cloud: FakeCloud,
                                                                  store) -> None:
    cloud.reset()
    body = {"model": "auto", "max_tokens": 6, "metadata": {"complexity": "high"},
            "messages": [{"role": "user", "content": "Design a distributed tea brewing algorithm"}]}
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)
    assert r.headers["x-ortserve-provider"] == "openrouter"           # without a store: the cloud
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60,
                   json={**body, "file_search": {"vector_store_ids": [store.id]}})
    assert r.status_code == 200, r.text
    assert r.headers["x-ortserve-provider"] == "local" and r.json()["citations"]
    assert len(cloud.requests) == 1


def test_bad_file_search_is_4xx(srv: ServerThread, store) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": msgs,
                                                           "file_search": {"vector_store_ids": ["vs_nope"]}})
    assert r.status_code == 404 and r.json()["error"]["param"] == "vector_store_id"
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": msgs, "file_search": {
        "vector_store_ids": [store.id], "ranking": "x"}})
    assert r.status_code == 400 and "ranking" in r.json()["error"]["param"]
