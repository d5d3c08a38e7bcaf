"""The leak-finding debug setting (server/memtrace.py): SIGUSR2 dumps the Python heap's biggest
allocation sites, and from the second dump on, what grew since the first."""

from __future__ import annotations

import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.clocks import wait_until

from ortserve.server import memtrace

held: list[bytes] = []


@pytest.fixture()
def restore() -> Iterator[None]:
    old = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, old)
    tracemalloc.stop()
    held.clear()


def grow(n: int) -> None:
    held.extend(os.urandom(1024) for _ in range(n))


def test_each_signal_writes_a_dump_and_the_second_names_what_grew(tmp_path: Path, restore: None) -> None:
    trace = memtrace.install(tmp_path, {"ORTSERVE_DEBUG_TRACEMALLOC": "4"})
    assert trace is not None and tracemalloc.is_tracing()
    os.kill(os.getpid(), signal.SIGUSR2)
    first = tmp_path / "tracemalloc" / "dump-1.txt"
    assert wait_until(first.exists)
    grow(4000)  # 4 MB held by grow()'s line
    os.kill(os.getpid(), signal.SIGUSR2)
    second = tmp_path / "tracemalloc" / "dump-2.txt"
    assert wait_until(lambda: second.exists() and "growth since dump 1" in second.read_text(encoding="utf-8"))
    growth = second.read_text(encoding="utf-8").split("growth since dump 1:", 1)[1].strip().splitlines()
    assert growth[0].startswith("+") and "KiB (+4000 blocks)" in growth[0], growth[:10]
    line = grow.__code__.co_firstlineno + 1   # the allocating line: grow()'s body
    assert growth[1].strip().endswith(f"test_memtrace.py:{line}"), growth[:10]


@pytest.mark.parametrize("env", [{}, {"ORTSERVE_DEBUG_TRACEMALLOC": "0"}, {"ORTSERVE_DEBUG_TRACEMALLOC": " "}])
def test_off_by_default(tmp_path: Path, env: dict[str, str]) -> None:
    was = tracemalloc.is_tracing()
    assert memtrace.install(tmp_path, env) is None
    assert tracemalloc.is_tracing() == was
