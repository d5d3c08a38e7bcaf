"""The process heap: make a long-running server's RSS follow what it really holds (glibc)."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

# glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
HEAP_ARENAS = 2                  # malloc arenas for the whole process
HEAP_MMAP_THRESHOLD = 256 << 10  # allocations from this size up get their own mapping
HEAP_TRIM_EVERY_S = 30.0         # a serving process hands its heap's freed pages back this often

log = logging.getLogger("ortserve.heap")


def tune_heap() -> bool:
    """Make a long-running server's RSS follow what it really holds (Linux/glibc; call it before
    the model loads, so threads created later share the few arenas).

    * Few arenas: glibc gives threads up to 8 x cores arenas of 64 MB; the engine thread, ONNX
      Runtime's workers and the event loop each fragment their own, and a soak's RSS crept up
      for minutes as each reached its own high-water mark (16 streams: a 590 MB plateau with
      6 arenas, 460 MB with 2, measured with benchmarks/soak.py).
    * A fixed mmap threshold: glibc raises its threshold to the largest block ever freed (up
      to 32 MB), after which KV buffers and other large arrays come from the heap and stay there
      when freed. Fixed at 256 KB, they are mapped and unmapped (a decode step allocates nothing
      that large; the KV cache and ONNX Runtime's arena are allocated rarely).

    A user's own ``MALLOC_ARENA_MAX`` / ``MALLOC_MMAP_THRESHOLD_`` win. Returns whether it applied.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        done = False
        if "MALLOC_ARENA_MAX" not in os.environ:
            done = bool(libc.mallopt(_M_ARENA_MAX, HEAP_ARENAS)) or done
        if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            done = bool(libc.mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)) or done
        return done
    except (OSError, AttributeError):  # not glibc (musl): nothing to tune
        return False


def trim_heap() -> None:
    """Ask glibc to return freed heap pages to the system (numpy buffers under the mmap threshold
    stay in the heap otherwise, and RSS never comes down)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def _rss_bytes() -> int:
    """This process's resident bytes (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text(encoding="ascii").split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """``trim_heap()`` every ``every_s`` seconds while the process serves, busy or not.

    The engine trims when it goes idle, but a mixed load is never idle, and glibc keeps what is
    freed below the mmap threshold (the prefix cache's slices, ONNX Runtime's, SQLite's and the
    tokenizers' small buffers) in the arenas' free lists: a one-hour soak's RSS crept up 1.6 MB a
    minute, about 4/5 of it freed memory (docs/robustness.md). ``malloc_trim(0)`` is thread-safe
    (it takes each arena's lock in turn) and takes milliseconds; ``tick`` is the decision, ``start``
    runs it on a daemon thread. ``clock``, ``trim`` and ``rss`` are injectable for tests.
    """

    def __init__(self, every_s: float = HEAP_TRIM_EVERY_S, clock: Callable[[], float] = time.monotonic,
                 trim: Callable[[], None] = trim_heap, rss: Callable[[], int] = _rss_bytes) -> None:
        self.every_s, self.clock, self.trim, self.rss = every_s, clock, trim, rss
        self.last = clock()
        self.trims = 0
        self.released_bytes = 0   # RSS before a trim less after, summed (what the trims gave back)
        self.longest_s = 0.0      # the longest trim, on the injected clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def due(self) -> bool:
        return self.clock() - self.last >= self.every_s

    def tick(self) -> bool:
        """Trim if ``every_s`` has passed since the last one; whether it trimmed."""
        if not self.due():
            return False
        before, t0 = self.rss(), self.clock()
        self.trim()
        self.last = self.clock()
        self.trims += 1
        self.released_bytes += max(0, before - self.rss())
        self.longest_s = max(self.longest_s, self.last - t0)
        return True

    def start(self) -> HeapTrimmer:
        if self._thread is None and self.every_s > 0 and sys.platform.startswith("linux"):
            self._thread = threading.Thread(target=self._run, name="ortserve-heap-trim", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, self.every_s - (self.clock() - self.last))):
            if self.tick():
                log.debug("heap trim %d: %.1f MB given back so far, longest %.3f s",
                          self.trims, self.released_bytes / 2**20, self.longest_s)


def start_heap_trimmer(env: dict[str, str] | None = None) -> HeapTrimmer | None:
    """The serving process's trimmer: every ``ORTSERVE_HEAP_TRIM_S`` seconds (default 30; 0 turns
    it off), on Linux only. Returns the running trimmer, or None."""
    raw = (env if env is not None else os.environ).get("ORTSERVE_HEAP_TRIM_S", "").strip()
    try:
        every = float(raw) if raw else HEAP_TRIM_EVERY_S
    except ValueError:
        log.warning("ORTSERVE_HEAP_TRIM_S=%r is not a number of seconds; using %s", raw, HEAP_TRIM_EVERY_S)
        every = HEAP_TRIM_EVERY_S
    if every <= 0 or not sys.platform.startswith("linux"):
        return None
    return HeapTrimmer(every).start()
