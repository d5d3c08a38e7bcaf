"""A server whose engine survives: a killed engine thread or a stalled step turns /healthz to
503 with the reason, new requests fail fast with 503 + Retry-After, the engine restarts in
process and the next request succeeds; per-request deadlines; KV-budget and context limits."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from clocks import EngineHold, ManualClock, wait_until
from servers import ServerThread

MSG = [{"role": "user", "content": "hello"}]


STALL_TIMEOUT = 60.0  # no real step of a loaded machine comes near it; the stall test moves the clock


@pytest.fixture(scope="module")
def srv(tiny_model: Path):
    with ServerThread(tiny_model, max_length=192, default_max_tokens=512, stall_timeout=STALL_TIMEOUT) as s:
        yield s


def post(srv: ServerThread, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, timeout=60)


def wait_health(srv: ServerThread, status: int, timeout: float = 120.0) -> dict:  # a hang guard only
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(f"{srv.url}/healthz", timeout=5)
        if r.status_code == status:
            return r.json()
        time.sleep(0.02)
    raise AssertionError(f"/healthz never answered {status}")


def check_restart_cycle(srv: ServerThread, breaker, reason_word: str) -> list[dict]:
    """Start a stream, break the engine while it runs, watch /healthz go 503 and back; returns the
    stream's events. The engine is held between two steps while ``breaker(core)`` runs, so the
    request is mid-flight whatever the machine's speed (150 tokens once ended before a loaded
    client read its first chunk)."""
    restarts = srv.state.engine.watchdog.restarts
    core = srv.state.engine.core
    body = {"messages": MSG, "stream": True, "max_tokens": 150, "min_tokens": 150, "temperature": 0}
    with EngineHold(core) as hold, httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body,
                                                 timeout=120) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        assert hold.held.wait(120)  # the request is running, the engine between two steps
        breaker(core)
        hold.release()
        health = wait_health(srv, 503)
        assert health["status"] == "unavailable" and reason_word in health["reason"]
        r = post(srv, {"messages": MSG, "max_tokens": 4})
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "engine_unavailable" and reason_word in r.json()["error"]["message"]
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]
    assert wait_health(srv, 200)["restarts"] == restarts + 1
    r = post(srv, {"messages": MSG, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    return events


def test_killed_engine_thread_restarts_and_serves_again(srv: ServerThread) -> None:
    events = check_restart_cycle(srv, lambda core: core.kill(), "died")
    errors = [e["error"] for e in events if "error" in e]
    assert errors and "restarting" in errors[0]["message"] and errors[0]["code"] == "engine_restart"


def test_stalled_step_restarts_and_serves_again(srv: ServerThread) -> None:
    release = threading.Event()

    def stall(core) -> None:  # the running request's next model call hangs until released ...
        clock = core.clock = ManualClock()
        for seq in list(core.running):
            core.plant_fault(seq.id, release, "stall")  # type: ignore[arg-type]
        threading.Thread(target=lambda: wait_until(lambda: not core.faults) and clock.advance(STALL_TIMEOUT + 1),
                         daemon=True).start()  # ... and, once it hangs, for longer than stall_timeout

    try:
        events = check_restart_cycle(srv, stall, "stalled")
    finally:
        release.set()  # the abandoned thread returns from its step and exits
    assert any("error" in e and e["error"]["code"] == "engine_restart" for e in events)


def test_request_deadline_counts_queue_time(srv: ServerThread) -> None:
    r = post(srv, {"messages": MSG, "max_tokens": 60, "min_tokens": 60, "timeout": 0.001})
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    assert "timeout of 0.001s" in r.json()["error"]["message"]
    assert srv.wait_idle().running == 0  # the engine dropped it
    r = post(srv, {"messages": MSG, "timeout": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "timeout"
    r = post(srv, {"messages": MSG, "max_tokens": 3, "timeout": 30})
    assert r.status_code == 200


def test_a_request_that_never_fits_the_kv_budget_is_a_400(srv: ServerThread) -> None:
    core = srv.state.engine.core
    saved = core.kv_budget
    core.kv_budget = 40 * core.runner.bytes_per_token
    try:
        r = post(srv, {"messages": MSG, "max_tokens": 50})
    finally:
        core.kv_budget = saved
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "kv_budget_exceeded" and err["param"] == "max_tokens" and "kv_cache_mb" in err["message"]


def test_default_max_tokens_is_clamped_to_the_context(srv: ServerThread) -> None:
    # max_length 192, default_max_tokens 512: without a max_tokens the answer fills the room left
    r = post(srv, {"messages": MSG, "min_tokens": 0, "temperature": 0})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    finish = r.json()["choices"][0]["finish_reason"]
    assert usage["total_tokens"] <= 192
    assert finish == "stop" or (finish == "length" and usage["total_tokens"] == 192)
    # an explicit max_tokens past the context is still the caller's mistake
    r = post(srv, {"messages": MSG, "max_tokens": 400})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
