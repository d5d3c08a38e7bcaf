"""Rerank (docs/rerank.md): /v1/rerank, /rerank and /v2/rerank with the real `cohere` client and httpx,
a cross-encoder imported through `models import` and compared with sentence-transformers'
CrossEncoder, the default chat model as a yes/no judge, and reranked vector-store search and
file_search answers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
from rerank_material import JUDGED, make_cross_encoder
from servers import ServerThread

RERANKER = "test-reranker"
QUERY = "how do plants make their food?"
DOCS = ["Plants make sugar from light, water and carbon dioxide in their leaves.",
        "The stock market fell on Tuesday.", "a",
        "Photosynthesis " * 40,   # a long one: many tokens of one word
        "Bananas are yellow and rich in potassium."]


@pytest.fixture(scope="module")
def ce_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_cross_encoder(tmp_path_factory.mktemp("cross-encoder") / "ms-marco-minilm-shape")


@pytest.fixture(scope="module")
def reference(ce_dir: Path) -> Any:
    """sentence-transformers' CrossEncoder on the same directory (torch: the test's side only)."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(1)   # a few small batches: spinning OpenMP threads only slow a busy machine
    return CrossEncoder(str(ce_dir), device="cpu")


@pytest.fixture(scope="module")
def home(ce_dir: Path, embedding_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding the cross-encoder (imported as a user would) and the embedding model (copied)."""
    from ortserve.models.importer import import_path
    from ortserve.models.store import ModelStore

    home = tmp_path_factory.mktemp("rerank-home")
    v = import_path(ModelStore(home / "models"), ce_dir, model_id=RERANKER)
    assert (v.kind, v.variant) == ("reranker", "fp32-cpu") and v.quality["max_abs_diff"] < 1e-4
    for variant in embedding_model.parent.glob(embedding_model.name.split("--")[0] + "--*"):
        shutil.copytree(variant, home / "models" / variant.name)
    return home


@pytest.fixture(scope="module")
def srv(default_model: Path, home: Path) -> Iterator[ServerThread]:
    with ServerThread(default_model, model_id="smollm2-135m", home=home, rag_dir=home / "rag",
                      rag_reranker=RERANKER) as s:
        yield s


def test_cross_encoder_scores_equal_sentence_transformers(home: Path, reference: Any) -> None:
    from ortserve.models.store import ModelStore
    from ortserve.rerank.cross_encoder import CrossEncoder

    ce = CrossEncoder(ModelStore(home / "models").get(RERANKER).model_dir)
    got = ce.score(QUERY, DOCS).scores
    want = reference.predict([(QUERY, d) for d in DOCS])
    assert np.abs(got - want).max() < 1e-4, (got, want)
    assert np.ptp(want) > 0.01   # the random model's scores differ, so the order is tested too
    assert list(np.argsort(-got)) == list(np.argsort(-want))


def test_cohere_client_v2(srv: ServerThread, reference: Any) -> None:
    co = cohere.ClientV2(base_url=srv.url, api_key="unused", timeout=120)
    r = co.rerank(model=RERANKER, query=QUERY, documents=DOCS, top_n=3)
    want = reference.predict([(QUERY, d) for d in DOCS])
    assert [x.index for x in r.results] == list(np.argsort(-want)[:3])
    for x in r.results:
        assert abs(x.relevance_score - want[x.index]) < 1e-4
    assert r.meta.billed_units.search_units == 1 and r.meta.tokens.input_tokens > 40
    # Cohere v1's client: documents come back on request
    v1 = cohere.Client(base_url=srv.url, api_key="unused", timeout=120).rerank(
        model=RERANKER, query=QUERY, documents=DOCS[:2], return_documents=True)
    assert {x.index: x.document.text for x in v1.results} == {0: DOCS[0], 1: DOCS[1]}


def test_jina_shape_and_object_documents(srv: ServerThread, reference: Any) -> None:
    docs: list[Any] = [{"text": DOCS[0], "id": "a"}, DOCS[1], {"text": DOCS[4]}]
    for path in ("/v1/rerank", "/rerank"):
        r = httpx.post(f"{srv.url}{path}", json={"model": RERANKER, "query": QUERY, "documents": docs}, timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        want = reference.predict([(QUERY, d if isinstance(d, str) else d["text"]) for d in docs])
        assert [x["index"] for x in body["results"]] == list(np.argsort(-want))
        assert body["results"][[x["index"] for x in body["results"]].index(0)]["document"] == docs[0]
        assert body["model"] == f"{RERANKER}:fp32-cpu" and body["usage"]["total_tokens"] > 20
    r = httpx.post(f"{srv.url}/v2/rerank", json={"model": RERANKER, "query": QUERY, "documents": DOCS[:2]}, timeout=120)
    assert r.status_code == 200 and all("document" not in x for x in r.json()["results"])
    # rank_fields (Cohere v1): objects ranked on the named fields
    r = httpx.post(f"{srv.url}/v1/rerank", json={"model": RERANKER, "query": QUERY, "rank_fields": ["title"],
                                                 "documents": [{"title": DOCS[0]}, {"title": DOCS[1]}]}, timeout=120)
    assert r.status_code == 200 and len(r.json()["results"]) == 2
    # max_tokens_per_doc cuts the long document: fewer tokens billed
    full = httpx.post(f"{srv.url}/v1/rerank", json={"model": RERANKER, "query": QUERY, "documents": [DOCS[3]]}).json()
    cut = httpx.post(f"{srv.url}/v1/rerank", json={"model": RERANKER, "query": QUERY, "documents": [DOCS[3]],
                                                   "max_tokens_per_doc": 5}).json()
    assert cut["usage"]["total_tokens"] < full["usage"]["total_tokens"] - 20


@pytest.mark.parametrize(("body", "param", "status"), [
    ({"query": "q"}, "documents", 400),
    ({"documents": ["a"]}, "query", 400),
    ({"query": "q", "documents": []}, "documents", 400),
    ({"query": " ", "documents": ["a"]}, "query", 400),
    ({"query": "q", "documents": ["a", {"title": "no text"}]}, "documents.1.text", 400),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n", 400),
    ({"query": "q", "documents": ["a"], "return_documnts": True}, "return_documnts", 400),
    ({"query": "q", "documents": ["a"], "priority": 2}, "priority", 400),
    ({"query": "q", "documents": ["a"], "rank_fields": ["title"]}, "rank_fields", 400),
    ({"query": "q", "documents": ["a"], "model": "no-such-model"}, "model", 404),
    ({"query": "q", "documents": ["a"], "model": "all-minilm-l6-v2"}, "model", 400),
])
def test_bad_requests_name_the_field(srv: ServerThread, body: dict[str, Any], param: str, status: int) -> None:
    body = {"model": RERANKER, **body} if "model" not in body else body
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        r = httpx.post(f"{srv.url}{path}", json=body, timeout=60)
        assert r.status_code == status, r.text
        err = r.json()
        assert err["message"] and err["error"]["param"] == param, err   # Cohere's message, OpenAI's param


def test_default_chat_model_judges_relevance(srv: ServerThread) -> None:
    """The default model (SmolLM2-135M) as a yes/no judge ranks the relevant document first."""
    first = 0
    for query, docs in JUDGED:   # docs[0] is the relevant one
        r = httpx.post(f"{srv.url}/v1/rerank", json={"model": "smollm2-135m", "query": query, "documents": docs,
                                                     "return_documents": False}, timeout=300)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "smollm2-135m" and len(body["results"]) == len(docs)
        scores = [x["relevance_score"] for x in body["results"]]
        assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
        first += body["results"][0]["index"] == 0
    assert first >= 0.8 * len(JUDGED), f"{first} of {len(JUDGED)}"
    # no model named: the server's own chat model judges
    r = httpx.post(f"{srv.url}/rerank", json={"query": JUDGED[0][0], "documents": JUDGED[0][1]}, timeout=300)
    assert r.status_code == 200 and r.json()["model"] == "smollm2-135m"


@pytest.fixture(scope="module")
def store_id(srv: ServerThread) -> str:
    import openai

    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)
    vs = client.vector_stores.create(name="facts")
    for name, text in [("tea.txt", "Green tea should be brewed with water at 80 degrees Celsius."),
                       ("bikes.txt", "Oil a bicycle chain every 300 kilometres."),
                       ("paris.txt", "Paris is the capital and largest city of France.")]:
        f = client.files.create(file=(name, text.encode()), purpose="assistants")
        client.vector_stores.files.create_and_poll(vector_store_id=vs.id, file_id=f.id)
    return vs.id


def test_vector_store_search_takes_a_reranker(srv: ServerThread, store_id: str, reference: Any) -> None:
    url = f"{srv.url}/v1/vector_stores/{store_id}/search"
    q = "What is the capital of France?"
    hits = httpx.post(url, json={"query": q, "ranking_options": {"ranker": RERANKER}}, timeout=120).json()["data"]
    want = reference.predict([(q, h["content"][0]["text"]) for h in hits])
    assert len(hits) == 3 and np.abs(np.array([h["score"] for h in hits]) - want).max() < 1e-4
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    judged = httpx.post(url, json={"query": q, "max_num_results": 2,
                                   "ranking_options": {"ranker": "smollm2-135m"}}, timeout=300).json()["data"]
    assert len(judged) == 2 and judged[0]["filename"] == "paris.txt"
    top = httpx.post(url, json={"query": q, "ranking_options": {"ranker": RERANKER, "score_threshold": 1.0}}).json()
    assert top["data"] == [] or all(h["score"] >= 1.0 for h in top["data"])
    bad = httpx.post(url, json={"query": q, "ranking_options": {"ranker": "no-such-reranker"}}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "ranking_options.ranker", bad.text
    fused = httpx.post(url, json={"query": q, "ranking_options": {"ranker": "auto"}}, timeout=60).json()["data"]
    assert fused[0]["filename"] == "paris.txt" and fused[0]["score"] != hits[0]["score"]


def test_file_search_answers_use_the_configured_reranker(srv: ServerThread, store_id: str, reference: Any) -> None:
    q = "How hot should the water be for green tea?"
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": q}], "max_tokens": 2,
        "file_search": {"vector_store_ids": [store_id], "max_num_results": 2}}, timeout=300)
    assert r.status_code == 200, r.text
    cites = r.json()["citations"]
    texts = {"tea.txt": "Green tea should be brewed with water at 80 degrees Celsius.",
             "bikes.txt": "Oil a bicycle chain every 300 kilometres.",
             "paris.txt": "Paris is the capital and largest city of France."}
    want = dict(zip(texts, reference.predict([(q, t) for t in texts.values()]), strict=True))
    assert [c["filename"] for c in cites] == sorted(want, key=lambda f: -want[f])[:2]   # the reranker's order
    assert all(abs(c["score"] - want[c["filename"]]) < 1e-4 for c in cites)


def test_responses_file_search_tool_takes_a_reranker(srv: ServerThread, store_id: str, reference: Any) -> None:
    import openai

    oai = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)
    q = "What is the capital of France?"
    tool: Any = {"type": "file_search", "vector_store_ids": [store_id], "max_num_results": 2,
                 "ranking_options": {"ranker": RERANKER}}
    r = oai.responses.create(model="smollm2-135m", input=q, tools=[tool], include=["file_search_call.results"],
                             max_output_tokens=2)
    fs = next(o for o in r.output if o.type == "file_search_call")
    scores = [x.score for x in fs.results]
    want = reference.predict([(q, x.text) for x in fs.results])
    assert len(scores) == 2 and np.abs(np.array(scores) - want).max() < 1e-4 and scores == sorted(scores, reverse=True)
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="smollm2-135m", input=q, max_output_tokens=2,
                             tools=[{**tool, "ranking_options": {"ranker": "no-such-reranker"}}])
    assert e.value.body["param"] == "tools.0.ranking_options.ranker"  # type: ignore[index]
