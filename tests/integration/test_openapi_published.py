"""/openapi.json publishes what the routes enforce (issue 45's ``validation_mismatch``,
server/published.py): for a few operations, a body the published schema refuses is the one the
server refuses, with a 400 naming the field, and its sibling the schema accepts is not refused for
that field. The document is validated with jsonschema (OpenAPI 3.1 schemas are JSON Schema 2020-12)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from tests.servers import ServerThread


@pytest.fixture(scope="module")
def srv(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(tiny_model, home=tmp_path_factory.mktemp("openapi-published-home"), max_tokens_cap=8,
                      default_max_tokens=4) as s:
        yield s


@pytest.fixture(scope="module")
def spec(srv: ServerThread) -> dict[str, Any]:
    return httpx.get(f"{srv.url}/openapi.json", timeout=60).json()  # type: ignore[no-any-return]


def body_schema(spec: dict[str, Any], path: str) -> Draft202012Validator:
    content = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return Draft202012Validator({**content, "components": spec["components"]})


# (path, the refused body, the field its 400 names, a sibling body the schema accepts)
CASES = [
    ("/v1/completions", {"prompt": "hi", "temperature": 2.5}, "temperature", {"prompt": "hi", "temperature": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens", {"prompt": "hi", "max_tokens": 1}),
    ("/v1/completions", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop",
     {"prompt": "hi", "stop": ["a", "b", "c", "d"]}),
    ("/v1/completions", {"prompt": "hi", "keep_alive": "soon"}, "keep_alive", {"prompt": "hi", "keep_alive": "5m"}),
    ("/v1/embeddings", {"input": " \n"}, "input", {"input": "hi"}),
    ("/v1/embeddings", {"input": ["x"] * 2049}, "input", {"input": ["x"] * 2048}),
    ("/v1/embeddings", {"input": [3, -1]}, "input", {"input": [3, 1]}),
    ("/v1/rerank", {"query": "  ", "documents": ["a"]}, "query", {"query": "q", "documents": ["a"]}),
    ("/v1/rerank", {"query": "q", "documents": [{"title": "a"}]}, "documents.0.text",
     {"query": "q", "documents": [{"text": "a"}]}),
    ("/v2/rerank", {"query": "q", "documents": ["a"], "priority": 1}, "priority",
     {"query": "q", "documents": ["a"], "priority": 0}),
    ("/v1/messages", {"model": "x", "max_tokens": 4, "messages": [{"content": "hi"}]}, "messages.0.role",
     {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages/count_tokens", {"model": "x", "messages": [{"role": "user", "content": "hi"}],
                                   "tool_choice": {"type": "some"}}, "tool_choice.type",
     {"model": "x", "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "auto"}}),
    ("/api/show", {}, "model", {"name": "nothing-here"}),
    ("/api/copy", {"source": "a", "destination": "Not A Name"}, "destination",
     {"source": "a", "destination": "b:tag"}),
    ("/api/create", {"model": "new-one"}, "from", {"model": "new-one", "from": "nothing-here"}),
    ("/api/embed", {"model": "m", "input": ["a", " "]}, "input.1", {"model": "m", "input": ["a", "b"]}),
    ("/v1/vector_stores/vs_none/file_batches", {}, "file_ids", {"file_ids": ["file-x"]}),
    ("/v1/vector_stores/vs_none/search", {"query": ["", " "]}, "query", {"query": ["", "a"]}),
]


@pytest.mark.parametrize(("path", "bad", "field", "good"), CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
def test_the_published_schema_refuses_what_the_route_refuses(srv: ServerThread, spec: dict[str, Any], path: str,
                                                             bad: dict[str, Any], field: str,
                                                             good: dict[str, Any]) -> None:
    template = path.replace("vs_none", "{vs_id}")
    schema = body_schema(spec, template)
    assert not schema.is_valid(bad), f"{template}: the published schema accepts {bad}"
    assert schema.is_valid(good), list(schema.iter_errors(good))
    r = httpx.post(f"{srv.url}{path}", json=bad, timeout=120)
    assert r.status_code == 400, r.text
    assert field in r.text, r.text
    r = httpx.post(f"{srv.url}{path}", json=good, timeout=120)
    assert r.status_code != 400 or field not in r.text, r.text


@pytest.mark.parametrize("path", ["/v1/vector_stores/{vs_id}/files",
                                  "/v1/vector_stores/{vs_id}/file_batches/{batch_id}/files"])
def test_the_status_filter_is_published_as_the_enum_it_is_checked_against(srv: ServerThread, spec: dict[str, Any],
                                                                           path: str) -> None:
    [param] = [p for p in spec["paths"][path]["get"]["parameters"] if p["name"] == "filter"]
    assert param["schema"]["enum"] == ["in_progress", "completed", "failed", "cancelled"]
    url = path.replace("{vs_id}", "vs_none").replace("{batch_id}", "vsfb_none")
    r = httpx.get(f"{srv.url}{url}", params={"filter": "done"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "filter", r.text


def test_a_completion_without_max_tokens_takes_the_cap_not_a_400(srv: ServerThread) -> None:
    """Completions' OpenAI default (16) above the server's cap (8) was a 400 naming a max_tokens the
    client never sent; now the cap applies. Sent explicitly, 16 is still the 400."""
    r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "Once upon a time", "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    assert 1 <= r.json()["usage"]["completion_tokens"] <= 8
    r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "Once", "max_tokens": 16}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


@pytest.mark.parametrize(("path", "field", "bad"), [("/v1/files", "purpose", "fine-tune"),
                                                    ("/v1/audio/transcriptions", "response_format", "mp4"),
                                                    ("/v1/audio/translations", "response_format", "mp4")])
def test_the_multipart_forms_are_published_with_the_values_checked(srv: ServerThread, spec: dict[str, Any], path: str,
                                                                   field: str, bad: str) -> None:
    form = spec["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert "file" in form["schema"]["required"] and form["schema"]["additionalProperties"] is False
    assert bad not in form["schema"]["properties"][field]["enum"]
    r = httpx.post(f"{srv.url}{path}", files={"file": ("notes.txt", b"hello")}, data={field: bad}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
