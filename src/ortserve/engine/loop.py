"""The engine's own thread: what other threads may call, and the loop that runs the steps.

Requests and aborts arrive from the event loop's thread under one lock; the engine thread
wakes when there is work, applies aborts, runs one ``step()`` (engine/core.py) and goes
round again. A step that raises outside per-request isolation fails what runs and the loop
goes on; anything that ends the thread is recorded in ``died`` for the watchdog.

Tests reach in through the hooks here: faults planted per request, and ``kill``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("ortserve.engine")


class EngineCrash(BaseException):
    """Tests: raised in the loop thread to kill it, as a fatal native error would."""


class EngineThread:
    """The thread plumbing of the engine core; subclasses define the step and its work."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._aborts: set[str] = set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.clock: Callable[[], float] = time.monotonic  # what stalls are timed by (tests: a manual one)
        self.step_started: float | None = None  # clock() when the current step began
        self.died: str | None = None             # why the loop thread ended abnormally
        # Tests: faults planted per request. "step" makes any model call that includes the
        # request's row raise (as a broken kernel would); "postprocess" makes its sampling raise.
        self.faults: dict[str, tuple[str, BaseException]] = {}
        self.fault: Exception | None = None  # planted as a "step" fault on the next sequence scheduled
        self.crash: BaseException | None = None  # raised in the loop thread, outside step isolation

    # ---- what a subclass defines --------------------------------------------
    def has_work(self) -> bool:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def apply_aborts(self, ids: set[str]) -> None:
        raise NotImplementedError

    def fail_all(self, message: str, code: str | None = None) -> None:
        raise NotImplementedError

    # ---- thread-safe API --------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ortserve-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def abort(self, request_id: str) -> None:
        with self._cond:
            self._aborts.add(request_id)
            self._cond.notify()

    def plant_fault(self, request_id: str, exc: BaseException, where: str = "step") -> None:
        """Tests: ``where`` is "step" (its model calls raise ``exc``), "postprocess" (its sampling
        raises ``exc``) or "stall" (its next model call sleeps ``str(exc)`` seconds, once; or, given a
        ``threading.Event``, blocks until it is set: a stall that lasts exactly as long as the test says)."""
        self.faults[request_id] = (where, exc)

    def kill(self, exc: BaseException | None = None) -> None:
        """Make the loop thread die, as an uncaught native error would (tests; the watchdog
        abandons a stalled thread this way: it exits when its step returns)."""
        with self._cond:
            self.crash = exc or EngineCrash("engine thread killed")
            self._cond.notify()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stalled_for(self) -> float:
        """Seconds the current step has been running (0 when idle)."""
        started = self.step_started
        return self.clock() - started if started is not None else 0.0

    def check_fault(self, request_id: str, where: str) -> None:
        """Tests: raise (or stall) here if a fault was planted for this request and place."""
        planted = self.faults.get(request_id)
        if planted is None:
            return
        if where == "step" and planted[0] == "stall":  # tests: a kernel that hangs for a while
            self.faults.pop(request_id, None)
            stall: object = planted[1]
            if isinstance(stall, threading.Event):
                stall.wait()
            else:
                time.sleep(float(str(stall)))
        elif planted[0] == where:
            raise planted[1]

    # ---- loop -------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._stop or self.has_work() or self._aborts or self.crash):
                        self._cond.wait()
                    if self.crash is not None:
                        raise self.crash
                    if self._stop and not self.has_work():
                        return
                    aborts, self._aborts = self._aborts, set()
                self.step_started = self.clock()
                try:
                    self.apply_aborts(aborts)
                    self.step()
                except Exception as exc:  # a bug outside per-request isolation: fail what runs, go on
                    log.exception("engine step failed")
                    self.fail_all(f"generation failed: {type(exc).__name__}: {exc}")
                finally:
                    self.step_started = None
        except BaseException as exc:  # the thread ends; the watchdog sees why
            self.died = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, EngineCrash):
                log.critical("engine thread died: %s", self.died, exc_info=exc)
