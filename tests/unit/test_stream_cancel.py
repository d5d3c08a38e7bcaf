"""A stream whose consumer is cancelled aborts its engine request, even when the cancel lands in
the same loop iteration as a token (the web page's Stop, tests/browser/test_ui_chat.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from ortserve.engine.engine import RequestHandle
from ortserve.types import TokenEvent


class Core:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def token(i: int) -> TokenEvent:
    return TokenEvent(request_id="r", text=f"t{i} ", token_ids=[i])


async def cancel_while_tokens_arrive(timeout: float | None) -> tuple[list[str], int]:
    core = Core()
    handle = RequestHandle(SimpleNamespace(core=core), "r", input_tokens=3, timeout=timeout)  # type: ignore[arg-type]
    seen = 0

    async def consume() -> None:
        nonlocal seen
        async for _ in handle:  # as merge()'s pump task reads it for the chat route
            seen += 1

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0)
    for i in range(200):
        handle.queue.put_nowait(token(i))  # wakes the waiting get() ...
        if i == 5:
            task.cancel()  # ... and the client leaves in the same iteration
        await asyncio.sleep(0)
    handle.queue.put_nowait(TokenEvent(request_id="r", text="", finished=True, finish_reason="length"))
    await asyncio.gather(task, return_exceptions=True)
    return core.aborted, seen


def test_cancel_racing_a_token_aborts_the_request_with_a_deadline() -> None:
    # With a deadline (the default: ORTSERVE_TIMEOUT=600) the wait used asyncio.wait_for, which on
    # Python 3.11 swallowed such a cancel: the request generated on to max_tokens.
    aborted, seen = asyncio.run(cancel_while_tokens_arrive(timeout=600.0))
    assert aborted == ["r"] and seen < 20


def test_cancel_racing_a_token_aborts_the_request_without_a_deadline() -> None:
    aborted, seen = asyncio.run(cancel_while_tokens_arrive(timeout=None))
    assert aborted == ["r"] and seen < 20


def test_a_deadline_still_ends_a_silent_request() -> None:
    async def run() -> TokenEvent:
        handle = RequestHandle(SimpleNamespace(core=Core()), "r", input_tokens=3, timeout=0.05)  # type: ignore[arg-type]
        return await handle._next()

    ev = asyncio.run(run())
    assert ev.finished and ev.error_code == "timeout"
