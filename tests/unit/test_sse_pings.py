"""SSEPings: an idle event stream gets ': ping' comments; other responses never do."""

from __future__ import annotations

import asyncio
from typing import Any

from ortserve.server.sse import PING, SSEPings


def _run(app: Any, interval: float, on_message: Any = None) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)
        if on_message is not None:
            on_message(sent)

    asyncio.run(SSEPings(app, interval)({"type": "http"}, receive, send))
    return sent


def _bodies(sent: list[dict[str, Any]]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


def test_an_idle_event_stream_is_pinged_until_it_speaks_again() -> None:
    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await release.wait()  # a long prefill: nothing to say
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def watch(sent: list[dict[str, Any]]) -> None:
        if _bodies(sent).count(PING) == 3:
            release.set()  # the event the test waits for: three pings while idle

    bodies = _bodies(_run(app, 0.01, watch))
    assert bodies[0] == b"data: 1\n\n" and bodies[1:4] == [PING] * 3
    assert bodies[4:] == [b"data: 2\n\n", b""]  # nothing after the last message


def test_other_responses_and_interval_zero_get_no_pings() -> None:
    async def json_app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await asyncio.sleep(0.1)  # ten intervals of silence
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    assert _bodies(_run(json_app, 0.01)) == [b"{}"]

    async def sse_app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})

    assert _bodies(_run(sse_app, 0)) == [b"data: 1\n\n"]
