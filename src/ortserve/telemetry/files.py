"""Rotating JSON-lines files for telemetry, safe with several worker processes.

Layout: one flat directory holding `<signal>-<UTC start>-p<pid>-<token>.jsonl` files, signal
being traces, metrics or logs. Each process writes only files it created (the pid and a
random token are in the name), opened O_APPEND and written one whole line per write call,
so workers never interleave. A file is closed and a new one started when it passes
`max_file_bytes` or is older than `max_file_age_s`; at each rotation the oldest files of
any process are deleted until the directory, plus room for the new file to fill, fits in
`max_total_bytes` (and files older than `retention_s` go too). So one writer never exceeds
the cap; with W writers (3 signals x workers) the directory can pass it by at most the
partly filled current files of the other W-1. A writer whose file was pruned by another process notices the
unlinked inode and starts a fresh one.

Writes happen on the SDK's background export threads, never on the request path. An
OSError (full disk, unwritable directory) turns into one warning on the
`ortserve.telemetry` logger, the record is dropped, and writing is retried after
`retry_after_s`; the server keeps serving.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

log = logging.getLogger("ortserve.telemetry")

SIGNALS = ("traces", "metrics", "logs")
FILE_RE = re.compile(r"^(traces|metrics|logs)-(\d{8}T\d{6}(?:\d{6})?Z)-p(\d+)-([0-9a-f]+)\.jsonl$")


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int = 8 * 1024 * 1024
    max_file_age_s: float = 3600.0
    max_total_bytes: int = 256 * 1024 * 1024
    retention_s: float | None = None
    retry_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_file_bytes < 1 or self.max_total_bytes < 2 * self.max_file_bytes:
            raise ValueError("telemetry limits: max_total_bytes must be at least twice max_file_bytes")


@dataclass(frozen=True)
class TelemetryFile:
    path: Path
    signal: str
    size: int
    mtime: float

    @property
    def name(self) -> str:
        return self.path.name


def list_files(directory: Path, signal: str | None = None) -> list[TelemetryFile]:
    """Telemetry files in `directory`, oldest first (names start with the UTC open time)."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        m = FILE_RE.match(entry.name)
        if not m or (signal is not None and m.group(1) != signal):
            continue
        try:
            st = entry.stat()
        except OSError:  # pruned meanwhile
            continue
        out.append(TelemetryFile(Path(entry.path), m.group(1), st.st_size, st.st_mtime))
    out.sort(key=lambda f: (FILE_RE.match(f.name).group(2), f.name))  # type: ignore[union-attr]
    return out


def prune(directory: Path, limits: Limits, keep: frozenset[str] = frozenset(),
          now: float | None = None, reserve: int = 0) -> int:
    """Delete the oldest files until the directory plus `reserve` bytes (room for the file
    just opened to fill) fits the limits; returns bytes freed."""
    files = list_files(directory)
    now = time.time() if now is None else now
    total = sum(f.size for f in files)
    budget = max(0, limits.max_total_bytes - reserve)
    freed = 0
    for f in files:
        too_old = limits.retention_s is not None and now - f.mtime > limits.retention_s
        if total <= budget and not too_old:
            continue
        if f.name in keep:
            continue
        try:
            f.path.unlink()
        except FileNotFoundError:
            pass
        except OSError:  # Windows: another process has it open
            continue
        total -= f.size
        freed += f.size
    return freed


class Health:
    """Failure state shared by the writers of one directory, so a full disk or an unwritable
    directory yields one warning (not one per signal or per record) and periodic retries."""

    def __init__(self) -> None:
        self.dropped = 0
        self.failing = False
        self._retry_at = 0.0
        self._lock = threading.Lock()

    def may_try(self, now: float) -> bool:
        with self._lock:
            if self.failing and now < self._retry_at:
                self.dropped += 1
                return False
            return True

    def failed(self, exc: OSError, now: float, directory: Path, retry_after_s: float) -> None:
        with self._lock:
            self.dropped += 1
            self._retry_at = now + retry_after_s
            if self.failing:
                return
            self.failing = True
        log.warning("telemetry: cannot write to %s (%s); dropping telemetry, serving continues, "
                    "retrying every %.0fs", directory, exc.strerror or exc, retry_after_s)

    def succeeded(self, directory: Path) -> None:
        if not self.failing:
            return
        with self._lock:
            self.failing = False
            dropped = self.dropped
        log.warning("telemetry: writing to %s again (%d records were dropped)", directory, dropped)


class RotatingWriter:
    """Appends lines to this process's current file for one signal. Thread-safe."""

    def __init__(self, directory: Path, signal: str, limits: Limits = Limits(),
                 health: Health | None = None, clock: Callable[[], float] = time.time) -> None:
        if signal not in SIGNALS:
            raise ValueError(f"unknown signal {signal!r}")
        self.directory = Path(directory)
        self.signal = signal
        self.limits = limits
        self.health = health or Health()
        self.clock = clock  # wall-clock seconds: file names and age rotation (tests: a manual one)
        self.written = 0
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._path: Path | None = None
        self._pid = 0
        self._opened_at = 0.0
        self._size = 0

    @property
    def path(self) -> Path | None:
        return self._path

    def write_line(self, line: str) -> bool:
        """Append one line; False (and a dropped record) if the disk refused it."""
        data = line.encode("utf-8") + b"\n"
        with self._lock:
            now = self.clock()
            if not self.health.may_try(now):
                return False
            try:
                fd = self._ready(len(data), now)
                _write_all(fd, data)
            except OSError as exc:
                self._close()
                self.health.failed(exc, now, self.directory, self.limits.retry_after_s)
                return False
            self._size += len(data)
            self.written += 1
            self.health.succeeded(self.directory)
            return True

    def close(self) -> None:
        with self._lock:
            self._close()

    # -- internals (called with the lock held)

    def _ready(self, incoming: int, now: float) -> int:
        fd = self._fd
        if fd is not None and (
            self._pid != os.getpid()  # forked: never share the parent's file
            or (self._size and self._size + incoming > self.limits.max_file_bytes)
            or now - self._opened_at > self.limits.max_file_age_s
            or _unlinked(fd)
        ):
            self._close()
            fd = None
        if fd is None:
            fd = self._open(now)
        return fd

    def _open(self, now: float) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1e6) % 1_000_000:06d}Z"
        path = self.directory / f"{self.signal}-{stamp}-p{os.getpid()}-{secrets.token_hex(3)}.jsonl"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
        fd = os.open(path, flags, 0o644)
        self._fd, self._path, self._pid = fd, path, os.getpid()
        self._opened_at, self._size = now, 0
        with contextlib.suppress(OSError):
            prune(self.directory, self.limits, keep=frozenset({path.name}),
                  reserve=self.limits.max_file_bytes)
        return fd

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _unlinked(fd: int) -> bool:
    if os.name == "nt":  # open files cannot be deleted there
        return False
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return True


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """An inter-process lock held for the block (filelock: flock on POSIX, msvcrt on Windows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path):
        yield


def read_complete_lines(path: Path, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(end offset, line) for each newline-terminated line from `offset`; a partial last line
    (a file still being written) is left for later."""
    if not path.exists():  # pruned since it was listed
        return
    with Path(path).open("rb") as fh:
        fh.seek(offset)
        pos = offset
        for raw in fh:
            if not raw.endswith(b"\n"):
                return
            pos += len(raw)
            yield pos, raw
