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


# ---- every model kind x route x mode (issue 46) ---------------------------------------------------
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}
FN = {"name": "get_weather", "description": "The weather in a city.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
MODES = ("plain", "streamed", "tools_required", "tools_auto", "json_schema")


def cell(route: str, mode: str, model: str) -> tuple[str, dict[str, Any]]:
    """The request of one cell in the route's own wire shape."""
    path, make = ROUTES[route]
    body = make(model)
    if "max_tokens" in body:
        body["max_tokens"] = 8
    tools = mode.startswith("tools")
    required = mode == "tools_required"
    if tools:
        body["max_tokens" if route != "responses" else "max_output_tokens"] = 64
    if route in ("chat", "completions", "seed", "embeddings"):
        if tools:
            body["tools"] = [{"type": "function", "function": FN}]
            body["tool_choice"] = "required" if required else "auto"
        if mode == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    elif route == "responses":
        body["max_output_tokens"] = 64 if tools else 16   # Responses' own minimum is 16
        if tools:
            body["tools"] = [{"type": "function", **FN}]
            body["tool_choice"] = "required" if required else "auto"
        if mode == "json_schema":
            body["text"] = {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA}}
    elif route == "messages":
        if tools:
            body["tools"] = [{"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}]
            body["tool_choice"] = {"type": "any" if required else "auto"}
        if mode == "json_schema":
            body["output_config"] = {"format": {"type": "json_schema", "schema": SCHEMA}}
    if mode == "streamed":
        body["stream"] = True
        if route == "seed":
            path = "/v1/chat/stream"
    return path, body


def _answer_ok(route: str, mode: str, r: httpx.Response) -> str | None:
    """Why a 200 answer of a chat route is not what the mode promises (None when it is)."""
    if mode == "streamed" or route not in ("chat", "messages", "responses"):
        return None
    body = r.json()
    if mode == "tools_required":
        calls = {"chat": lambda: body["choices"][0]["message"].get("tool_calls"),
                 "messages": lambda: [b for b in body["content"] if b["type"] == "tool_use"],
                 "responses": lambda: [o for o in body["output"] if o["type"] == "function_call"]}[route]()
        return None if calls else f"required without a call: {r.text[:300]}"
    return None


def run_matrix(url: str, models: dict[str, str]) -> list[tuple[str, str, str, int]]:
    """Every (model, route, mode) cell against one server: name -> kind (chat, embedding, adapter).
    Returns the cells as (model, route, mode, status); asserts each is an answer or a 4xx in the
    route's shape, chat models answer the chat routes, and ``required`` holds a call."""
    out = []
    with httpx.Client(timeout=300) as client:
        for name, kind in models.items():
            for route in ROUTES:
                for mode in MODES:
                    path, body = cell(route, mode, name)
                    r = client.post(f"{url}{path}", json=body)
                    out.append((name, route, mode, r.status_code))
                    where = (name, route, mode, r.status_code, r.text[:300])
                    assert r.status_code < 500, where
                    if r.status_code != 200:
                        assert 400 <= r.status_code < 500 and _shape_ok(route, r.status_code, r.json()), where
                    elif mode == "streamed" and route != "embeddings":
                        assert "data:" in r.text and "Internal Server Error" not in r.text, where
                    if kind in ("chat", "adapter") and route in CHAT_ROUTES and mode in ("plain", "streamed"):
                        assert r.status_code == 200, where
                    if kind in ("chat", "adapter") and route in ("chat", "messages", "responses") \
                            and mode != "plain" and mode != "streamed":
                        assert r.status_code == 200, where
                    if r.status_code == 200:
                        assert (why := _answer_ok(route, mode, r)) is None, (*where[:3], why)
                    if mode.startswith("tools") and route in ("completions", "seed", "embeddings"):
                        assert r.status_code in (400, 404), where   # refused, never silently ignored
                    if kind == "embedding":
                        assert r.status_code == 200 or route != "embeddings" or mode != "plain", where
    return out


def test_default_and_embedding_and_adapter_on_every_route_and_mode(srv: ServerThread) -> None:
    cells = run_matrix(srv.url, {"smollm2-135m-instruct": "chat", "text-embedding-3-small": "embedding"})
    assert len(cells) == 2 * len(ROUTES) * len(MODES) and not [c for c in cells if c[3] >= 500]


def test_lora_adapter_on_every_route_and_mode(lora: Any, tiny_model: Path) -> None:
    with ServerThread(tiny_model, home=lora.home) as s:
        cells = run_matrix(s.url, {"my-adapter": "adapter", "tiny": "chat"})
    assert len(cells) == 2 * len(ROUTES) * len(MODES)


def test_each_family_on_every_route_and_mode(family_models: dict[str, Path]) -> None:
    for name, model_dir in family_models.items():
        with ServerThread(model_dir, model_id=name) as s:
            run_matrix(s.url, {name: "chat"})


def test_gemma3_270m_on_every_route_and_mode(gemma3_270m: Path) -> None:
    with ServerThread(gemma3_270m, model_id="gemma-3-270m") as s:
        run_matrix(s.url, {"gemma-3-270m": "chat"})
