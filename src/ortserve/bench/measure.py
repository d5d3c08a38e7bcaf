"""Timing and memory figures, stdlib only (the Optimum worker runs in a venv without ortserve deps)."""

from __future__ import annotations

import math
import os
import pathlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Timing:
    """One request of one repetition, in seconds from the moment the batch was started."""

    first: float  # first generated token
    end: float  # last generated token
    tokens: int  # generated tokens
    input_tokens: int = 0


def summarize_rep(timings: list[Timing]) -> dict[str, float]:
    """Figures of one repetition of a batch.

    ttft: mean time to first token over the batch; latency: until the last token of the batch;
    decode_tps: tokens after the first ones over the time after the last first token (the
    steady decode phase of the batch); throughput: all generated tokens over latency.
    """
    latency = max(t.end for t in timings)
    last_first = max(t.first for t in timings)
    decode_tokens = sum(max(t.tokens - 1, 0) for t in timings)
    decode_time = latency - last_first
    return {
        "ttft": sum(t.first for t in timings) / len(timings),
        "latency": latency,
        "decode_tps": decode_tokens / decode_time if decode_time > 0 else 0.0,
        "throughput": sum(t.tokens for t in timings) / latency if latency > 0 else 0.0,
        "output_tokens": float(sum(t.tokens for t in timings)),
        "input_tokens": float(sum(t.input_tokens for t in timings) / len(timings)),
    }


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), as numpy's default."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc, else psutil, else 0)."""
    try:
        with pathlib.Path(f"/proc/{pid}/statm").open(encoding="utf-8") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.Process(pid).memory_info().rss)
    except Exception:  # noqa: BLE001 - no way to measure: report 0 and let the report say so
        return 0


class PeakRSS:
    """Samples the RSS of some processes every ``interval`` seconds; ``peak`` is the largest sum seen."""

    def __init__(self, pids: Callable[[], list[int]], interval: float = 0.02) -> None:
        self.pids = pids
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        self.peak = max(self.peak, sum(rss_bytes(p) for p in self.pids()))

    def __enter__(self) -> PeakRSS:  # noqa: PYI034 - Python 3.10 has no typing.Self
        self.sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()


def now() -> float:
    return time.perf_counter()
