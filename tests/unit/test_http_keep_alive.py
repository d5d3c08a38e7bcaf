"""The server's idle-connection timeout: longer than clients keep pooled connections, so a
client never sends on a connection the server is closing (the soak's transport errors)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn
from pydantic import ValidationError
from tests.clocks import wait_until

from ortserve.config import load_settings
from ortserve.loopback import free_port
from ortserve.server.run import uvicorn_config


async def _app(scope, receive, send):  # a plain ASGI app: the keep-alive is uvicorn's, not the routes'
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_setting_reaches_uvicorn(monkeypatch):
    assert uvicorn_config(_app, load_settings()).timeout_keep_alive == 65.0
    assert uvicorn_config(_app, load_settings(http_keep_alive=7.5)).timeout_keep_alive == 7.5
    monkeypatch.setenv("ORTSERVE_HTTP_KEEP_ALIVE", "120")
    assert uvicorn_config(_app, load_settings()).timeout_keep_alive == 120.0
    with pytest.raises(ValidationError, match=r"http_keep_alive|ORTSERVE_HTTP_KEEP_ALIVE"):
        load_settings(http_keep_alive=0)


def _get(sock: socket.socket) -> bytes:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while not data.endswith(b"ok"):
        chunk = sock.recv(4096)
        if not chunk:
            return data  # the server closed the connection
        data += chunk
    return data


def test_a_connection_idle_past_uvicorns_default_is_still_served():
    """Idle 6 s (past uvicorn's own 5 s), then a second request on the same socket is answered."""
    settings = load_settings(host="127.0.0.1", port=free_port(), log_level="warning")
    server = uvicorn.Server(uvicorn_config(_app, settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: server.started, 120)
        with socket.create_connection(("127.0.0.1", settings.port), timeout=120) as sock:
            assert _get(sock).startswith(b"HTTP/1.1 200")
            time.sleep(6.0)  # the decision under test: 6 s < 65 s, the connection stays open
            assert _get(sock).startswith(b"HTTP/1.1 200")
    finally:
        server.should_exit = True
        thread.join(30)
