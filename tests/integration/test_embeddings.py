"""/v1/embeddings through the official openai client, on the real default embedding model."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from tests.servers import ServerThread


@pytest.fixture(scope="module")
def srv(tiny_model: Path, embedding_model: Path, tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(tiny_model, rag_dir=tmp_path_factory.mktemp("rag")) as s:
        yield s


@pytest.fixture()
def client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def test_float_and_base64_agree_and_are_normalised(client: openai.OpenAI, srv: ServerThread) -> None:
    texts = ["The cat sat on the mat.", "A dog barked at the mailman all morning long."]
    f = client.embeddings.create(model="all-minilm-l6-v2", input=texts, encoding_format="float")
    assert [d.index for d in f.data] == [0, 1] and len(f.data[0].embedding) == 384
    assert f.usage.prompt_tokens == f.usage.total_tokens > 10
    raw = httpx.post(f"{srv.url}/v1/embeddings", json={"model": "minilm", "input": texts,
                                                         "encoding_format": "base64"}).json()
    b = np.frombuffer(base64.b64decode(raw["data"][1]["embedding"]), dtype="<f4")
    assert np.allclose(b, f.data[1].embedding, atol=1e-6)
    assert abs(np.linalg.norm(b) - 1) < 1e-4
    # the client's default (base64, decoded by the SDK) gives the same vectors
    d = client.embeddings.create(model="all-minilm-l6-v2", input=texts)
    assert np.allclose(d.data[0].embedding, f.data[0].embedding, atol=1e-6)


def test_similar_sentences_are_closer(client: openai.OpenAI) -> None:
    r = client.embeddings.create(model="all-minilm-l6-v2", input=[
        "How do I reset my password?", "I forgot my password and need a new one.", "Bananas are yellow."])
    v = np.array([d.embedding for d in r.data])
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3


def test_token_arrays_match_text(client: openai.OpenAI, srv: ServerThread) -> None:
    _, emb = srv.state.embedder.get()
    ids = emb.tokenizer.encode("Offline retrieval works.", add_special_tokens=False).ids
    by_text = client.embeddings.create(model="all-minilm-l6-v2", input="Offline retrieval works.",
                                       encoding_format="float")
    by_ids = client.embeddings.create(model="all-minilm-l6-v2", input=ids, encoding_format="float")
    assert np.allclose(by_ids.data[0].embedding, by_text.data[0].embedding, atol=1e-5)
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == len(ids) + 2
    two = client.embeddings.create(model="all-minilm-l6-v2", input=[ids, ids[:2]], encoding_format="float")
    assert len(two.data) == 2 and two.usage.prompt_tokens == len(ids) + 2 + 2 + 2
    # batch mates never move a vector (issue 45: the int8 variant runs one input per session run)
    assert two.data[0].embedding == by_ids.data[0].embedding


def _error(exc: pytest.ExceptionInfo) -> dict:
    return exc.value.body if isinstance(exc.value.body, dict) and "param" in exc.value.body \
        else exc.value.response.json()["error"]


def test_too_long_is_400_unless_truncation_is_asked(client: openai.OpenAI) -> None:
    long = "word " * 400
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="all-minilm-l6-v2", input=["short", long])
    err = _error(e)
    assert err["param"] == "input" and err["code"] == "context_length_exceeded" and "256" in err["message"]
    r = client.embeddings.create(model="all-minilm-l6-v2", input=long, extra_body={"truncate": True})
    assert r.usage.prompt_tokens == 256


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["ok", "  "]}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [10**9]}, "input"),
    ({"input": "hi", "dimensions": 128}, "dimensions"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "hi", "model": "tiny"}, "model"),
])
def test_bad_input_is_400_naming_param(srv: ServerThread, kwargs: dict, param: str) -> None:
    body = {"model": "all-minilm-l6-v2", **kwargs}
    r = httpx.post(f"{srv.url}/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_unknown_model_is_404_and_unknown_field_400(srv: ServerThread) -> None:
    r = httpx.post(f"{srv.url}/v1/embeddings", json={"model": "nope", "input": "hi"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(f"{srv.url}/v1/embeddings", json={"model": "minilm", "input": "hi", "pool": "max"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "pool"
