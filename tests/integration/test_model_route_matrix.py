"""Every model id on every route: the pinned model, its store id and aliases, embedding models
(full id, alias, OpenAI's default embedding names), unknown names and router names, on chat,
completions, responses, messages, embeddings and the seed API. Each gets its answer or a 400/404
in that API's own error shape, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import ServerThread

pytestmark = pytest.mark.default_model

MSG = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, tuple[str, Any]] = {
    "chat": ("/v1/chat/completions", lambda m: {"model": m, "messages": MSG, "max_tokens": 2}),
    "completions": ("/v1/completions", lambda m: {"model": m, "prompt": "hi", "max_tokens": 2}),
    "responses": ("/v1/responses", lambda m: {"model": m, "input": "hi", "max_output_tokens": 2, "store": False}),
    "messages": ("/v1/messages", lambda m: {"model": m, "messages": MSG, "max_tokens": 2}),
    "embeddings": ("/v1/embeddings", lambda m: {"model": m, "input": "hi"}),
    "seed": ("/v1/chat", lambda m: {"model": m, "messages": MSG, "max_tokens": 2}),
}
CHAT_ROUTES = {"chat", "completions", "responses", "messages", "seed"}


@pytest.fixture(scope="module")
def srv(default_model: Path, embedding_model: Path) -> Iterator[ServerThread]:
    with ServerThread(default_model, model_id="smollm2-135m-instruct") as s:
        yield s


def _models(srv: ServerThread) -> dict[str, str]:
    """name -> kind, for every name a client could send."""
    listed = httpx.get(f"{srv.url}/v1/models").json()["data"]
    names = {d["id"]: d.get("kind") or "chat" for d in listed}
    for d in listed:
        for alias in d.get("aliases") or []:
            names.setdefault(alias, d.get("kind") or "chat")
    names.update({"default": "chat", "text-embedding-3-small": "embedding", "text-embedding-ada-002": "embedding",
                  "no-such-model": "unknown", "auto": "router", "openai:gpt-4o": "unknown"})
    return names


def _shape_ok(route: str, status: int, body: dict[str, Any]) -> bool:
    if status == 200:
        return True
    if route == "messages":
        return body.get("type") == "error" and isinstance(body["error"].get("message"), str)
    return isinstance(body.get("error", {}).get("message"), str)


def test_every_model_on_every_route(srv: ServerThread) -> None:
    names = _models(srv)
    assert "embedding" in names.values()  # the embedded embedding model is listed
    results = []
    for name, kind in names.items():
        for route, (path, body) in ROUTES.items():
            r = httpx.post(f"{srv.url}{path}", json=body(name), timeout=120)
            results.append((name, route, r.status_code))
            assert r.status_code in (200, 400, 404), (name, route, r.status_code, r.text[:300])
            assert _shape_ok(route, r.status_code, r.json()), (name, route, r.text[:300])
            if kind == "chat" and route in CHAT_ROUTES:
                assert r.status_code == 200, (name, route, r.text[:300])
            if kind == "embedding":
                assert r.status_code in ((200,) if route == "embeddings" else (400, 404)), (name, route, r.text[:300])
            if kind == "unknown":
                assert r.status_code in (400, 404), (name, route, r.text[:300])
    assert not [x for x in results if x[2] >= 500]
