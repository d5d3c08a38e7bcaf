"""A clock a test moves by hand: inject it where the code reads time (keep_alive, stalls, file age)
and assert on what the code decides, never on how long the machine took."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Self


class ManualClock:
    """Starts at the real clock's reading (so times taken before it was injected still compare),
    then moves only when the test calls :meth:`advance`. Thread-safe."""

    def __init__(self, start: float | None = None, real: Callable[[], float] = time.monotonic) -> None:
        self._now = real() if start is None else start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now


def wait_until(cond: Callable[[], object], timeout: float = 120.0, interval: float = 0.02) -> bool:
    """Poll ``cond`` until it holds; ``timeout`` is only a safety net against a hang (generous on
    purpose: a loaded machine is slow, never wrong)."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class EngineHold:
    """Holds an engine's loop thread right after the first step that leaves a request running,
    until :meth:`release`: a test then reads (or breaks) a request that is certainly mid-flight,
    however fast the engine or however late the client reads its first chunk.

        with EngineHold(engine.core) as hold:
            ... send a request ...
            assert hold.held.wait(120)   # the engine is between two steps, the request running
            ... look, plant a fault, kill ...
            hold.release()
    """

    def __init__(self, core: Any) -> None:
        self.core, self.held, self.go = core, threading.Event(), threading.Event()
        self._step = core.step

    def _held_step(self) -> None:
        self._step()
        if not self.held.is_set() and self.core.running:
            self.held.set()
            self.go.wait(600)  # a safety net: a test that forgets to release still ends

    def release(self) -> None:
        self.go.set()

    def __enter__(self) -> Self:
        self.core.step = self._held_step
        return self

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        self.core.__dict__.pop("step", None)
