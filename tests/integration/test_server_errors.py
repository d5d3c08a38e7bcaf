"""Bad input, overload and faults: clear OpenAI-shaped errors, never a 422/500, never a hang."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from clocks import EngineHold
from servers import ServerThread, free_port, wait_healthy

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def srv(tiny_model: Path):
    with ServerThread(tiny_model, max_tokens_cap=256, max_body_bytes=4096, max_length=512) as s:
        yield s


def post(srv: ServerThread, path: str, body: object, **kw: object) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{srv.url}{path}", content=content, headers={"content-type": "application/json"},
                      timeout=60, **kw)


def assert_error(r: httpx.Response, status: int, param: str | None, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    if code:
        assert err["code"] == code
    if status == 400:
        assert err["type"] == "invalid_request_error"
    return err


@pytest.mark.parametrize("path", ["/v1/chat", "/v1/chat/completions"])
@pytest.mark.parametrize("body,param", [
    ({"messages": MSG, "temperature": "hot"}, "temperature"),
    ({"messages": MSG, "temperature": -0.5}, "temperature"),
    ({"messages": MSG, "top_p": 0}, "top_p"),
    ({"messages": MSG, "top_p": 1.5}, "top_p"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "max_tokens": 100000}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({}, "messages"),
])
def test_bad_values_name_the_param(srv: ServerThread, path: str, body: dict, param: str) -> None:
    assert_error(post(srv, path, body), 400, param)


def test_nan_and_malformed_json(srv: ServerThread) -> None:
    assert_error(post(srv, "/v1/chat/completions", '{"messages": [{"role":"user","content":"x"}], '
                                                   '"temperature": NaN}'), 400, "temperature")
    assert_error(post(srv, "/v1/chat/completions", b'{"messages": [,,'), 400, None, "invalid_json")
    assert_error(post(srv, "/v1/completions", {"prompt": "x", "n": 0}), 400, "n")


def test_openai_client_raises_typed_errors(srv: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSG, temperature=5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-17", messages=MSG)


def test_context_length_exceeded_before_streaming(srv: ServerThread) -> None:
    long = [{"role": "user", "content": "word " * 600}]
    for path in ("/v1/chat/stream", "/v1/chat/completions"):
        r = post(srv, path, {"messages": long, "stream": True, "max_tokens": 8})
        err = assert_error(r, 400, "messages", "context_length_exceeded")
        assert "512" in err["message"]
    err = assert_error(post(srv, "/v1/chat/completions", {"messages": MSG, "max_tokens": 256,
                                                          "max_completion_tokens": 600}), 400,
                       "max_completion_tokens")  # the field the client sent names the error


def test_body_too_large(srv: ServerThread) -> None:
    r = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 10000}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"


def test_generation_error_mid_stream_then_keeps_serving(srv: ServerThread) -> None:
    # The engine fails the next step it runs: this request's first, after the stream has
    # started (the role chunk goes out before any token is generated).
    srv.state.engine.core.fault = RuntimeError("injected fault")
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", timeout=60,
                      json={"messages": MSG, "stream": True, "max_tokens": 200, "temperature": 0}) as resp:
        assert resp.status_code == 200
        lines = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert "chat.completion.chunk" in lines[0]
    errors = [json.loads(x) for x in lines[1:] if x != "[DONE]" and "error" in json.loads(x)]
    assert errors and "injected fault" in errors[0]["error"]["message"]
    assert srv.wait_idle().running == 0
    r = post(srv, "/v1/chat", {"messages": MSG, "max_tokens": 4})
    assert r.status_code == 200 and r.json()["metrics"]["output_tokens"] >= 1


def test_twenty_disconnects_free_their_slots(srv: ServerThread) -> None:
    async def leave_early(client: httpx.AsyncClient, stream: bool) -> None:
        body = {"messages": MSG, "stream": stream, "max_tokens": 250, "min_tokens": 250, "temperature": 0}
        if stream:
            async with client.stream("POST", f"{srv.url}/v1/chat/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        return  # read one chunk, then hang up
        else:
            try:
                await client.post(f"{srv.url}/v1/chat/completions", json=body, timeout=0.3)
            except httpx.TimeoutException:
                pass  # gave up while queued or generating

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(leave_early(client, stream=i % 2 == 0) for i in range(20)))

    asyncio.run(main())
    stats = srv.wait_idle(timeout=20)
    assert stats.running == 0 and stats.waiting == 0


def test_api_key_and_queue_full(tiny_model: Path) -> None:
    with ServerThread(tiny_model, api_key="s3cret", max_queue=1, max_batch=1) as s:
        assert httpx.get(f"{s.url}/healthz").status_code == 200  # health stays open
        r = httpx.post(f"{s.url}/v1/chat", json={"messages": MSG})
        assert_error(r, 401, None)
        r = httpx.post(f"{s.url}/v1/chat", json={"messages": MSG}, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        body = {"messages": MSG, "max_tokens": 1500, "min_tokens": 1500, "temperature": 0, "stream": True}

        async def main() -> None:
            # the engine is held mid-request while the queue fills: the first request holds the one
            # slot however fast the machine (a quick one could finish its 1,500 tokens meanwhile)
            async with httpx.AsyncClient(timeout=600, headers=auth) as client:
                url = f"{s.url}/v1/chat/completions"
                with EngineHold(s.state.engine.core) as hold:
                    async with client.stream("POST", url, json=body) as running:
                        lines = running.aiter_lines()
                        assert (await lines.__anext__()).startswith("data: ")  # accepted (the role chunk)
                        while not hold.held.is_set():  # the event: it left the queue and holds the slot
                            await asyncio.sleep(0.01)
                        assert s.state.engine.stats().running == 1
                        queued = asyncio.ensure_future(client.post(url, json={**body, "stream": False}))
                        deadline = time.monotonic() + 120  # the event: the second request is queued
                        while s.state.engine.stats().waiting != 1 and time.monotonic() < deadline:
                            await asyncio.sleep(0.01)
                        assert s.state.engine.stats().waiting == 1
                        r = await client.post(url, json=body)
                        assert_error(r, 429, None, "queue_full")
                        assert r.headers["retry-after"] == "1"
                        hold.release()
                        rest = [line async for line in lines if line.startswith("data: ")]
                assert rest[-1] == "data: [DONE]"  # accepted requests still finish
                done = await queued
                assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 1500

        asyncio.run(main())


def test_sigterm_drains_in_flight_then_exits(tiny_model: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "ORTSERVE_HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "ortserve.cli.main", "serve", "--model", str(tiny_model),
                             "--port", str(port), "--log-level", "warning"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 60, proc)
        body = {"messages": MSG, "stream": True, "max_tokens": 2000, "min_tokens": 2000, "temperature": 0}
        pieces = []
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as resp:
            lines = resp.iter_lines()
            pieces.append(next(line for line in lines if line.startswith("data: ")))
            proc.send_signal(signal.SIGTERM)
            while httpx.get(f"{url}/healthz", timeout=10).json()["status"] != "draining":
                time.sleep(0.01)
            late = httpx.post(f"{url}/v1/chat", json={"messages": MSG}, timeout=10)
            assert late.status_code == 503 and late.json()["error"]["code"] == "unavailable"
            pieces += [line for line in lines if line.startswith("data: ")]
        assert pieces[-1] == "data: [DONE]"
        finals = [json.loads(p[6:]) for p in pieces[:-1]]
        assert [c["choices"][0]["finish_reason"] for c in finals if c["choices"]][-1] == "length"
        # uvicorn re-raises the captured SIGTERM after a clean shutdown, as supervisors expect
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
