"""Server-sent events, and watching for clients that leave."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.requests import Request

T = TypeVar("T")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: Any) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


class ClientDisconnected(asyncio.CancelledError):
    """The client hung up before its (non-streaming) answer was ready: a cancel, not a failure."""


async def unless_disconnected(request: Request, work: Awaitable[T], poll: float = 0.25) -> T:
    """Await ``work``; cancel it (which aborts its engine requests) if the client goes away."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise ClientDisconnected("client disconnected")
    finally:
        if not task.done():
            task.cancel()


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
