"""Finding a leak in a running server (a debug setting, off by default; docs/robustness.md).

``ORTSERVE_DEBUG_TRACEMALLOC=N`` starts ``tracemalloc`` with N frames per allocation before the
app is built; then each ``SIGUSR2`` (``kill -USR2 PID``) writes ``HOME/tracemalloc/dump-K.txt``:
the Python heap's total, the allocation sites holding the most memory, and the sites that grew
most since the first dump. Two dumps an hour apart under a steady load name what accumulates.
It sees Python objects only (not ONNX Runtime's or glibc's own memory) and slows allocation, so
it is for a soak, never for serving.
"""

from __future__ import annotations

import os
import signal
import threading
import tracemalloc
from pathlib import Path
from typing import Any


class MemTrace:
    def __init__(self, out_dir: Path, top: int = 40) -> None:
        self.out_dir = out_dir
        self.top = top
        self.first: tracemalloc.Snapshot | None = None
        self.count = 0
        self._lock = threading.Lock()

    def dump(self) -> Path:
        with self._lock:
            snap = tracemalloc.take_snapshot().filter_traces([
                tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, "<frozen importlib._bootstrap>")])
            self.count += 1
            current, peak = tracemalloc.get_traced_memory()
            lines = [f"dump {self.count}: traced {current / 2**20:.1f} MB (peak {peak / 2**20:.1f} MB)", "",
                     f"top {self.top} sites by size:"]
            for st in snap.statistics("traceback")[: self.top]:
                lines += [f"{st.size / 1024:.1f} KiB in {st.count} blocks", *_frames(st.traceback)]
            if self.first is None:
                self.first = snap
            else:
                lines += ["", f"top {self.top} growth since dump 1:"]
                for d in snap.compare_to(self.first, "traceback")[: self.top]:
                    lines += [f"{d.size_diff / 1024:+.1f} KiB ({d.count_diff:+d} blocks), now {d.size / 1024:.1f} KiB",
                              *_frames(d.traceback)]
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / f"dump-{self.count}.txt"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            return path


def _frames(tb: tracemalloc.Traceback) -> list[str]:
    """The allocation's frames, the allocating line first."""
    return [f"    {f.filename}:{f.lineno}" for f in reversed(tb)]   # no source lines: linecache would grow


def install(home: Path, env: dict[str, str] | None = None) -> MemTrace | None:
    """Start tracing and hook SIGUSR2 when ``ORTSERVE_DEBUG_TRACEMALLOC`` is a frame count > 0."""
    raw = (env if env is not None else os.environ).get("ORTSERVE_DEBUG_TRACEMALLOC", "").strip()
    if not raw or raw == "0":
        return None
    frames = int(raw) if raw.isdigit() else 1
    tracemalloc.start(frames)
    trace = MemTrace(home / "tracemalloc")

    def on_signal(signum: int, frame: Any) -> None:
        # off the signal handler: taking a snapshot of a big heap takes seconds
        threading.Thread(target=trace.dump, name="ortserve-memtrace", daemon=True).start()

    signal.signal(signal.SIGUSR2, on_signal)
    return trace
