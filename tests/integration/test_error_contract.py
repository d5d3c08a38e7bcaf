"""Every error a client can meet has the OpenAI shape and the right status: walks every route."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from clocks import EngineHold, wait_until
from servers import ServerThread
from starlette.routing import Route

from ortserve.server.app import UPLOAD_PATHS

MSG = [{"role": "user", "content": "hello"}]
LIMIT = 4096
UPLOAD_LIMIT = 8192  # /v1/files has its own limit (plus room for the multipart envelope)


@pytest.fixture(scope="module")
def srv(tiny_model: Path) -> Iterator[ServerThread]:
    with ServerThread(tiny_model, max_tokens_cap=512, max_body_bytes=LIMIT, max_length=1024,
                      max_upload_bytes=UPLOAD_LIMIT) as s:
        yield s


def routes(srv: ServerThread) -> list[tuple[str, set[str]]]:
    """(path with its parameters filled in, methods) for every API route the app has."""
    found = {path: {m.upper() for m in ops} for path, ops in srv.app.openapi()["paths"].items()}
    for r in srv.app.routes:  # the routes outside the schema (/openapi.json, /docs, ...)
        if isinstance(r, Route) and r.methods:
            found.setdefault(r.path, set()).update(r.methods)
    walked = [(re.sub(r"\{[^}]+\}", "x", path), methods) for path, methods in sorted(found.items())]
    # a fixed path can also match another route's template (/v1/responses/input_tokens is a POST of its
    # own and DELETE /v1/responses/{response_id}): those methods are served there too
    for path, methods in walked:
        methods.update(m for m in ("GET", "POST", "PUT", "DELETE", "PATCH") if served(srv, m, path))
    return walked


def served(srv: ServerThread, method: str, path: str) -> bool:
    """Whether some route of the app (included routers too) takes ``method`` at ``path``."""
    from starlette.routing import Match

    scope = {"type": "http", "method": method, "path": path, "root_path": "", "query_string": b"", "headers": []}
    return any(r.matches(scope)[0] == Match.FULL for r in srv.app.router.routes)


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    if r.request.url.path.startswith("/v1/messages"):  # Anthropic's API answers in Anthropic's shape
        body = r.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["message"]
        return body["error"]
    if r.request.url.path.startswith("/api/"):  # Ollama's API answers {"error": "..."}, as Ollama does
        body = r.json()
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
        return {"message": body["error"]}
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error") or status in (401, 429)
    if code is not None:
        assert err["code"] == code, err
    return err


def test_the_walk_covers_the_api(srv: ServerThread) -> None:
    paths = {p for p, _ in routes(srv)}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/chat", "/healthz"} <= paths


def test_wrong_method_on_every_route_is_a_405(srv: ServerThread) -> None:
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for path, methods in routes(srv):
            for wrong in sorted({"GET", "POST", "PUT", "DELETE", "PATCH"} - methods - {"HEAD"}):
                r = c.request(wrong, path)
                err = assert_openai_error(r, 405, "method_not_allowed")
                assert wrong in err["message"] and path in err["message"] and "allowed: " in err["message"]
                # Allow lists every method served at the path (a path may have several routes)
                assert set(r.headers["allow"].replace(" ", "").split(",")) >= methods - {"HEAD"}


def test_unknown_paths_are_a_404(srv: ServerThread) -> None:
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for method, path in [("GET", "/nope"), ("POST", "/v1/nope"), ("GET", "/v1/chat/completions/x"),
                             ("DELETE", "/v2/models"), ("GET", "/%ff")]:
            err = assert_openai_error(c.request(method, path), 404, "unknown_url")
            assert method in err["message"]


def test_oversized_bodies_are_a_413_chunked_or_not(srv: ServerThread) -> None:
    def chunked() -> Iterator[bytes]:  # no Content-Length: the server only learns the size by reading
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000]

    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for path, methods in routes(srv):
            if "POST" not in methods:
                continue
            size = 20 * (UPLOAD_LIMIT + 65536) if path in UPLOAD_PATHS else 3 * LIMIT
            big = json.dumps({"messages": [{"role": "user", "content": "x" * size}]}).encode()
            assert_openai_error(c.post(path, content=big, headers={"content-type": "application/json"}),
                                413, "payload_too_large")
            r = c.post(path, content=chunked(), headers={"content-type": "application/json"})
            assert "content-length" not in r.request.headers
            assert_openai_error(r, 413, "payload_too_large")
        assert c.get("/healthz").status_code == 200


@pytest.mark.parametrize("seed", ["abc", 1.5, [1], 2**64, -(2**64) - 1])
def test_bad_seed_on_every_generating_route_is_a_400_naming_it(srv: ServerThread, seed: object) -> None:
    bodies = {"/v1/chat/completions": {"messages": MSG, "max_tokens": 2},
              "/v1/completions": {"prompt": "hi", "max_tokens": 2}}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for path, body in bodies.items():
            err = assert_openai_error(c.post(path, json={**body, "seed": seed}), 400)
            assert err["param"] == "seed", err


def test_a_chat_template_that_raises_is_a_400_with_its_message(tiny_model: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported by this template') }}{% endif %}"
        "{% if m['content'] == 'boom' %}{{ m['content'].no_such_method() }}{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}", encoding="utf-8")
    with ServerThread(model, max_tokens_cap=64) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        sys_msg = [{"role": "system", "content": "be brief"}, *MSG]
        err = assert_openai_error(c.post("/v1/chat/completions", json={"messages": sys_msg, "max_tokens": 2}), 400)
        assert "System role not supported by this template" in err["message"] and err["param"] == "messages"
        r = c.post("/v1/chat", json={"messages": [{"role": "user", "content": "boom"}], "max_tokens": 2})
        err = assert_openai_error(r, 400, "chat_template_error")
        assert "no_such_method" in err["message"]
        ok = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
        assert ok.status_code == 200, ok.text


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _metric(text: str, status: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ortserve_requests_total{") and f'status="{status}"' in line
               and "/v1/chat/completions" in line)


def test_a_client_that_leaves_a_non_streaming_request_is_a_cancel(srv: ServerThread) -> None:
    handler = _Records()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "uvicorn", "ortserve", "asyncio")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        before = httpx.get(f"{srv.url}/metrics").text
        body = {"messages": MSG, "max_tokens": 400, "min_tokens": 400, "temperature": 0}

        async def leave() -> None:
            # the engine holds after a step that leaves the request running: the hang-up lands
            # mid-generation on any machine (a fast one could finish 400 tokens between two polls)
            with EngineHold(srv.state.engine.core) as hold:
                async with httpx.AsyncClient(base_url=srv.url) as c:
                    task = asyncio.ensure_future(c.post("/v1/chat/completions", json=body, timeout=120))
                    while not hold.held.is_set():  # event: generation has started
                        await asyncio.sleep(0.01)
                    task.cancel()  # hang up mid-generation
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    hold.release()

        asyncio.run(leave())
        assert wait_until(lambda: _metric(httpx.get(f"{srv.url}/metrics").text, "499") > _metric(before, "499"))
        after = httpx.get(f"{srv.url}/metrics").text
        assert _metric(after, "499") == _metric(before, "499") + 1
        assert _metric(after, "500") == _metric(before, "500")
        assert srv.wait_idle().running == 0
        gc.collect()  # an abandoned future logs 'exception was never retrieved' when collected
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    assert not [r for r in handler.records if r.exc_info or r.levelno >= logging.ERROR], \
        [r.getMessage() for r in handler.records]


def test_a_queued_stream_gets_pings_and_clients_still_parse_it(tiny_model: Path) -> None:
    import threading

    import openai

    with ServerThread(tiny_model, max_batch=1, sse_ping_seconds=0.05, max_tokens_cap=512) as s, \
            EngineHold(s.state.engine.core) as hold:
        long = threading.Thread(target=httpx.post, args=(f"{s.url}/v1/chat/completions",), kwargs={
            "json": {"messages": MSG, "max_tokens": 500, "min_tokens": 500}, "timeout": 120})
        long.start()
        assert hold.held.wait(120)  # event: the batch slot is taken, and stays taken until released
        body = {"messages": MSG, "max_tokens": 4, "stream": True}
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=body, timeout=120) as r:
            lines = []
            for line in r.iter_lines():  # queued behind the held one: silence, so pings
                lines.append(line)
                if line == ": ping":
                    hold.release()
        assert ": ping" in lines and "data: [DONE]" in lines
        assert lines.index(": ping") < lines.index("data: [DONE]")
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="tiny", messages=MSG, max_tokens=4, stream=True) if c.choices)
        assert text
        long.join(120)
