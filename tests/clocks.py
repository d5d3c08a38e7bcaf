"""A clock a test moves by hand: inject it where the code reads time (keep_alive, stalls, file age)
and assert on what the code decides, never on how long the machine took."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


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
