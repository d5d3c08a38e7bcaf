"""Server-sent events, and watching for clients that leave."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

T = TypeVar("T")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: Any) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


PING = b": ping\n\n"


class SSEPings:
    """ASGI middleware: while an event stream is idle (a long prefill, a queued request), send a
    ': ping' comment every ``interval`` seconds so proxies and clients do not cut it. SSE clients
    ignore comment lines. Hand-written because sse-starlette's pings need its own response class
    on every route; this covers every text/event-stream response the app sends, in one place."""

    def __init__(self, app: ASGIApp, interval: float) -> None:
        self.app = app
        self.interval = interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.interval <= 0:
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        lock = asyncio.Lock()
        last = loop.time()
        finished = False
        pinger: asyncio.Task[None] | None = None

        async def ping_loop() -> None:
            nonlocal last
            while True:
                await asyncio.sleep(max(0.0, last + self.interval - loop.time()))
                async with lock:
                    if finished:
                        return
                    if loop.time() - last >= self.interval:
                        try:
                            await send({"type": "http.response.body", "body": PING, "more_body": True})
                        except Exception:  # noqa: BLE001 - the client left; the app notices on its own
                            return
                        last = loop.time()

        async def send_and_watch(msg: Message) -> None:
            nonlocal last, finished, pinger
            async with lock:
                streaming = False
                if msg["type"] == "http.response.start":
                    ctype = dict(msg.get("headers", [])).get(b"content-type", b"")
                    streaming = ctype.startswith(b"text/event-stream")
                elif msg["type"] == "http.response.body" and not msg.get("more_body", False):
                    finished = True
                await send(msg)
                last = loop.time()
                if streaming and pinger is None:
                    pinger = asyncio.ensure_future(ping_loop())

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            finished = True
            if pinger is not None:
                pinger.cancel()
                await asyncio.wait({pinger})


class EventStream(StreamingResponse):
    """A StreamingResponse that always closes its generator when the response ends. When the
    client leaves, Starlette cancels the streaming task; if the cancel lands while a chunk is
    being sent (not inside the generator), the generator stays suspended at its `yield` and its
    engine requests go on generating until garbage collection finalises it. Closing it here runs
    its `finally` (and so aborts the requests) at once."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


class ClientDisconnected(asyncio.CancelledError):
    """The client hung up before its (non-streaming) answer was ready: a cancel, not a failure."""


async def unless_disconnected(request: Request, work: Awaitable[T], poll: float = 0.25) -> T:
    """Await ``work``; cancel it (which aborts its engine requests) if the client goes away.

    The body has been read by now, so the next ASGI message is the hang-up itself: it is awaited
    as an event, not polled, so that a short answer cannot finish before a hang-up is seen (with
    a 250 ms poll, a 400-token answer from a small model on a fast machine did, and was counted
    as a 200). A host whose receive() gives anything else falls back to polling."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_hang_up(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        if watcher.result():
            raise ClientDisconnected("client disconnected")
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected("client disconnected")
    finally:
        for t in (task, watcher):
            if not t.done():
                t.cancel()
                t.add_done_callback(_retrieve)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark an abandoned future's outcome as seen. A cancelled ``asyncio.gather`` ends with its
    CancelledError set as an exception, which asyncio would log as 'never retrieved', with a
    traceback, once the future is collected."""
    if not fut.cancelled():
        fut.exception()


async def _hang_up(request: Request) -> bool:
    """True once the client disconnects; False at once if receive() gives another message."""
    try:
        msg = await request.receive()
    except (OSError, RuntimeError):
        return False
    return msg.get("type") == "http.disconnect"


async def merge(*streams: AsyncIterator[T]) -> AsyncIterator[tuple[int, T]]:
    """Interleave several async iterators, tagging items with their index (for n > 1)."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    done = object()

    async def pump(i: int, it: AsyncIterator[T]) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


def sse_event(event: str, data: dict[str, Any]) -> str:
    """A named event (``event:`` line), as the Responses and Messages APIs stream them."""
    return f"event: {event}\n" + sse(data)
