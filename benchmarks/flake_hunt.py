"""Hunt flaky tests: a suite that never flakes, proven (docs/robustness.md, "A suite that never flakes").

Two modes, each printing one JSON summary (passes and failures per test) on stdout:

    # (a) every test that reads a clock, N times alone: one pytest process per test module, each
    #     selected test run N times in a row (its module's other tests are not run)
    .venv/bin/python benchmarks/flake_hunt.py clock --count 20

    # (b) the whole suite beside a CPU hog (one busy process per core), K times in a row
    .venv/bin/python benchmarks/flake_hunt.py suite --runs 3

"Reads a clock" is found in the source, not guessed: a test function (or a helper of its module
that it calls, or a fixture of its module it takes) whose text sleeps, reads time, polls with a
deadline, names a timeout, or uses tests/clocks.py (ManualClock, EngineHold, wait_until).
``clock --list`` prints the selection; ``clock -k EXPR`` or node ids narrow it.

The same file is the pytest plugin both modes load (``-p benchmarks.flake_hunt``): it repeats each collected
test FLAKE_REPEAT times and appends every outcome to FLAKE_REPORT (JSON lines).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a sleep or a read of time, a wait with a deadline, a short timeout (under a second), the settings
# that are timers (keep_alive, stall_timeout, load_wait, SSE pings), tests/clocks.py. A client's
# generous timeout=60 is not one: it guards a hang and never decides an outcome.
CLOCK = re.compile(r"time\.(sleep|monotonic|perf_counter|time)\(|asyncio\.sleep\((?!0\))|\bwait_for\(|"
                   r"\bdeadline\b|timeout=0?\.\d|timeout=0\b|ManualClock|EngineHold|wait_until\(|wait_idle\(|"
                   r"keep_alive=|stall_timeout|load_wait=|sse_ping_seconds|wait_for_timeout\(")
RUN_ID = re.compile(r"(-|\[)run\d+(-|\])")  # the repeat's own parameter, dropped from the test's name
FORMERLY_FLAKY = "tests/integration/test_engine_robust.py::test_time_budgeted_prefill_gives_the_same_tokens"


# ---- the pytest plugin ---------------------------------------------------------------------
@pytest.fixture
def flake_run(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """FLAKE_REPEAT=N: every test N times in a row, as N parameters (run1..runN) of itself."""
    repeat = int(os.environ.get("FLAKE_REPEAT", "1"))
    if repeat > 1:
        metafunc.fixturenames.append("flake_run")
        metafunc.parametrize("flake_run", range(1, repeat + 1), indirect=True, ids=lambda i: f"run{i}")


def pytest_runtest_logreport(report: Any) -> None:
    out = os.environ.get("FLAKE_REPORT")
    if not out or not (report.when == "call" or report.outcome != "passed"):
        return  # one line per test run: its call, or the setup/teardown that failed or skipped it
    test = RUN_ID.sub(lambda m: m.group(1) if m.group(2) == "-" else "]" if m.group(1) == "-" else "", report.nodeid)
    row = {"test": test, "when": report.when, "outcome": report.outcome, "seconds": round(report.duration, 3)}
    if report.failed:  # the end of the traceback: a failure is found and fixed, never rerun away
        row["error"] = str(report.longrepr)[-4000:]
    with Path(out).open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


# ---- which tests read a clock ------------------------------------------------------------------
def clock_tests(tests_dir: Path = ROOT / "tests") -> list[str]:
    """Node ids (file::function) of the test functions that read a clock, directly or through a
    helper function or fixture of their own module."""
    found: list[str] = []
    for path in sorted(tests_dir.rglob("test_*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        reads = {name for name, n in funcs.items() if CLOCK.search(ast.get_source_segment(source, n) or "")}
        for name, node in funcs.items():
            if not name.startswith("test_"):
                continue
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {a.arg for a in node.args.args}
            if name in reads or used & reads:
                found.append(f"{path.relative_to(ROOT).as_posix()}::{name}")
    if FORMERLY_FLAKY not in found:
        found.append(FORMERLY_FLAKY)
    return found


# ---- running -----------------------------------------------------------------------------------
def pytest(args: list[str], repeat: int, report: Path, timeout: float) -> int:
    # the plugin by its dotted name from the repository root (python -m puts the cwd on the path): with
    # benchmarks/ itself on PYTHONPATH, benchmarks/ray.py shadowed the ray package and test_ray.py
    # could not import ray.serve
    env = {**os.environ, "FLAKE_REPEAT": str(repeat), "FLAKE_REPORT": str(report)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.flake_hunt", "-p", "no:cacheprovider", *args]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, check=False, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except subprocess.TimeoutExpired:
        with report.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"test": " ".join(args), "when": "timeout", "outcome": "failed"}) + "\n")
        return 124
    if os.environ.get("FLAKE_VERBOSE"):
        sys.stderr.write(done.stdout)
    if done.returncode not in (0, 1):  # 1: tests failed, each one recorded; else nothing ran as asked
        # (a module that failed to import or collect, no test found): a failure too, never silence
        with report.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"test": " ".join(args), "when": "collect", "outcome": "failed",
                                "error": f"pytest exit {done.returncode}: {done.stdout[-4000:]}"}) + "\n")
    return done.returncode


def tally(report: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()] if report.exists() else []
    per: dict[str, Counter[str]] = defaultdict(Counter)
    secs: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        per[r["test"]][r["outcome"]] += 1
        if "seconds" in r:
            secs[r["test"]].append(r["seconds"])
    failures = {t: dict(c) for t, c in per.items() if c["failed"]}
    per_test = {t: {**dict(c), "median_s": sorted(secs[t])[len(secs[t]) // 2] if secs[t] else None,
                    "max_s": max(secs[t], default=None)} for t, c in sorted(per.items())}
    return {"tests": len(per), "runs": len(rows), "passed": sum(c["passed"] for c in per.values()),
            "failed": sum(c["failed"] for c in per.values()), "skipped": sum(c["skipped"] for c in per.values()),
            "failures": failures, "per_test": per_test}


def hog(n: int) -> list[subprocess.Popen[bytes]]:
    """One busy process per core (what a loaded CI machine looks like to the suite)."""
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:  # only the processes this script started, by their own handle
        p.kill()
        p.wait()


def run_clock(args: argparse.Namespace) -> dict[str, Any]:
    selected = args.tests or clock_tests()
    if args.list:
        print("\n".join(selected))
        sys.exit(0)
    by_module: dict[str, list[str]] = defaultdict(list)
    for node in selected:
        by_module[node.split("::")[0]].append(node)
    hogs = hog(args.hog) if args.hog else []
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(args.report) if args.report else Path(tmp) / "report.jsonl"
            for nodes in by_module.values():
                extra = ["-k", args.k] if args.k else []
                pytest([*nodes, *extra], args.count, report, args.timeout)
            out = tally(report)
    finally:
        stop(hogs)
    return {"mode": "clock", "count": args.count, "modules": len(by_module), "selected": len(selected),
            "hog_processes": args.hog, "seconds": round(time.monotonic() - t0, 1), **out}


def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    t0 = time.monotonic()
    for _ in range(args.runs):
        hogs = hog(args.hog)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                report = Path(tmp) / "report.jsonl"
                started = time.monotonic()
                rc = pytest([*args.tests] or ["tests"], 1, report, args.timeout)
                runs.append({"exit": rc, "seconds": round(time.monotonic() - started, 1), **tally(report)})
        finally:
            stop(hogs)
    return {"mode": "suite", "hog_processes": args.hog, "runs": runs, "green": sum(r["exit"] == 0 for r in runs),
            "seconds": round(time.monotonic() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    clock = sub.add_parser("clock", help="every test that reads a clock, N times alone")
    clock.add_argument("tests", nargs="*", help="node ids (default: the clock-reading tests found in tests/)")
    clock.add_argument("--count", type=int, default=20)
    clock.add_argument("-k", help="a pytest -k expression to narrow the selection")
    clock.add_argument("--hog", type=int, default=0, help="busy processes beside it (default none: alone)")
    clock.add_argument("--timeout", type=float, default=3600, help="seconds per module process (a hang guard)")
    clock.add_argument("--list", action="store_true", help="print the selection and exit")
    clock.add_argument("--report", help="keep every run's outcome, seconds and traceback here (JSON lines, appended)")
    suite = sub.add_parser("suite", help="the whole suite beside a CPU hog, K times")
    suite.add_argument("tests", nargs="*", help="paths or node ids (default: tests)")
    suite.add_argument("--runs", type=int, default=3)
    suite.add_argument("--hog", type=int, default=os.cpu_count() or 2, help="busy processes (default: one per core)")
    suite.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per suite run (a hang guard)")
    args = ap.parse_args()
    summary = run_clock(args) if args.mode == "clock" else run_suite(args)
    print(json.dumps(summary, indent=2))
    failed = summary["failed"] if args.mode == "clock" else sum(r["failed"] or r["exit"] != 0 for r in summary["runs"])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
