"""The watchdog: notices a dead engine thread or a stalled step, and restarts the engine in
process with the model reloaded, without restarting the server.

While it restarts, ``AsyncEngine.problem`` names the reason: /healthz answers 503 with it and
new requests fail fast with 503 and Retry-After. Requests that were running end with a clear
error (code ``engine_restart``), never a hang. Restarts back off (1, 2, 4 ... 30 s) so a model
that crashes on load does not spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from ortserve.engine.loop import EngineCrash

log = logging.getLogger("ortserve.engine")


class WatchedCore(Protocol):
    """What the watchdog reads of an engine loop (engine/loop.py ``EngineThread``)."""

    died: str | None

    @property
    def alive(self) -> bool: ...

    def stalled_for(self) -> float: ...

    def kill(self, exc: BaseException | None = None) -> None: ...

    def fail_all(self, message: str, code: str | None = None) -> None: ...


class Watched(Protocol):
    """What the watchdog needs of an engine (``AsyncEngine``): its loop, a place to say why it
    cannot serve, and a way to start a fresh loop with the model reloaded."""

    problem: str | None

    @property
    def core(self) -> WatchedCore: ...

    def reload(self) -> None: ...


class Watchdog:
    def __init__(self, engine: Watched, *, stall_timeout: float, interval: float = 0.25) -> None:
        self.engine = engine
        self.stall_timeout = stall_timeout
        self.interval = interval
        self.restarts = 0
        self.last_restart: float | None = None
        self.last_reason: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def diagnose(self) -> str | None:
        """Why the engine cannot serve right now, or None when it can."""
        core = self.engine.core
        if not core.alive:
            return f"engine thread died ({core.died or 'stopped'})"
        stalled = core.stalled_for()
        if stalled > self.stall_timeout:
            return f"engine step stalled for {stalled:.0f}s (stall_timeout is {self.stall_timeout:g}s)"
        return None

    def backoff(self) -> float:
        return float(min(30, 2 ** max(0, self.restarts)))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            reason = self.diagnose()
            if reason is not None:
                try:
                    await self.restart(reason)
                except Exception as exc:  # keep watching; the next round tries again
                    log.exception("engine restart failed")
                    self.engine.problem = f"{reason}; restart failed: {type(exc).__name__}: {exc}"

    async def restart(self, reason: str) -> None:
        engine = self.engine
        engine.problem = f"{reason}; restarting"
        log.error("%s: restarting the engine with the model reloaded", reason)
        old = engine.core
        old.kill(EngineCrash("abandoned by the watchdog"))  # a stalled thread exits when its step returns
        # The old thread is dead or stuck inside a model call: it touches its queues again only
        # after the call returns, and then exits at the top of its loop.
        old.fail_all(f"the engine failed ({reason}) and is restarting; retry the request",
                     code="engine_restart")
        await asyncio.sleep(self.backoff())
        await asyncio.to_thread(engine.reload)
        self.restarts += 1
        self.last_restart = time.time()
        self.last_reason = reason
        engine.problem = None
        log.warning("engine restarted (%d so far)", self.restarts)
