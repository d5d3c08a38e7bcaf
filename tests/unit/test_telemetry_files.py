"""Rotating telemetry files: size and age rotation, a capped directory, several processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.clocks import ManualClock

from ortserve.telemetry.files import Limits, RotatingWriter, list_files, read_complete_lines


def line(i: int, width: int = 100) -> str:
    head = json.dumps({"i": i, "pad": ""})
    return json.dumps({"i": i, "pad": "x" * max(0, width - len(head) - 1)})


def all_lines(directory: Path) -> list[dict]:
    return [json.loads(raw) for f in list_files(directory) for _, raw in read_complete_lines(f.path)]


def test_rotates_by_size(tmp_path: Path) -> None:
    w = RotatingWriter(tmp_path, "traces", Limits(max_file_bytes=1000, max_total_bytes=10**6))
    for i in range(95):
        assert w.write_line(line(i))
    w.close()
    files = list_files(tmp_path, "traces")
    assert len(files) == 10  # 9 lines of 101 bytes fit in 1000
    assert all(f.size <= 1000 for f in files)
    assert [r["i"] for r in all_lines(tmp_path)] == list(range(95))  # nothing lost, in order


def test_rotates_by_age(tmp_path: Path) -> None:
    clock = ManualClock(start=time.time())  # the file age is read from it: no sleep, no race
    w = RotatingWriter(tmp_path, "logs", Limits(max_file_age_s=60), clock=clock)
    w.write_line(line(0))
    first = w.path
    clock.advance(60)
    w.write_line(line(1))  # exactly 60 s old: kept
    assert w.path == first
    clock.advance(0.001)
    w.write_line(line(2))  # older than 60 s: a new file
    w.close()
    assert w.path != first
    assert len(list_files(tmp_path, "logs")) == 2
    assert [r["i"] for r in all_lines(tmp_path)] == [0, 1, 2]


def test_total_size_is_capped_and_newest_kept(tmp_path: Path) -> None:
    limits = Limits(max_file_bytes=2_000, max_total_bytes=10_000)
    w = RotatingWriter(tmp_path, "metrics", limits)
    for i in range(2_000):  # ~200 KB through a 10 KB budget
        w.write_line(line(i))
        assert sum(f.size for f in list_files(tmp_path)) <= limits.max_total_bytes
    w.close()
    kept = [r["i"] for r in all_lines(tmp_path)]
    assert kept[-1] == 1999 and kept == sorted(kept)
    assert len(kept) >= 60  # the budget is used, not emptied


def test_cap_counts_every_signal_and_other_processes_files(tmp_path: Path) -> None:
    old = tmp_path / "logs-20200101T000000000000Z-p1-abcdef.jsonl"
    old.write_bytes(b"{}\n" * 3000)  # 9 KB left by a dead worker
    w = RotatingWriter(tmp_path, "traces", Limits(max_file_bytes=1_000, max_total_bytes=5_000))
    w.write_line(line(0))
    w.close()
    assert not old.exists()


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        Limits(max_file_bytes=1000, max_total_bytes=1500)


def test_writer_starts_a_new_file_when_its_file_is_pruned(tmp_path: Path) -> None:
    w = RotatingWriter(tmp_path, "traces")
    w.write_line(line(0))
    assert w.path is not None
    w.path.unlink()  # another worker's prune
    w.write_line(line(1))
    w.close()
    assert [r["i"] for r in all_lines(tmp_path)] == [1]


def test_partial_last_line_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "traces-20260101T000000000000Z-p1-abcdef.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":')
    got = list(read_complete_lines(path))
    assert got == [(8, b'{"a":1}\n')]
    assert list(read_complete_lines(path, 8)) == []


WORKER = """
import sys
from pathlib import Path
from ortserve.telemetry.files import RotatingWriter, Limits
w = RotatingWriter(Path(sys.argv[1]), "traces", Limits(max_file_bytes=20_000, max_total_bytes=10**7))
for i in range(int(sys.argv[2])):
    w.write_line('{"pid": %s, "i": %d, "pad": "%s"}' % (sys.argv[3], i, "y" * 200))
w.close()
"""


def test_several_processes_write_intact_lines(tmp_path: Path) -> None:
    n = 400
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), str(n), str(k)])
             for k in range(3)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    records = all_lines(tmp_path)  # json.loads would fail on any interleaved line
    for k in range(3):
        assert [r["i"] for r in records if r["pid"] == k] == list(range(n))
    pids = {f.name.split("-p")[1].split("-")[0] for f in list_files(tmp_path)}
    assert len(pids) == 3 and str(os.getpid()) not in pids  # one set of files per process
