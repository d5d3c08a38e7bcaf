"""One backend's run, in its own process: python -m ortserve.bench.worker JOB.json RESULT.json

JOB holds the backend target ("module:Class"), its Spec, the workload cells and the prompts;
RESULT gets the per-repetition figures of every cell, peak RSS per cell and the quality score.
Stdlib only at module level (see the package docstring).
"""

from __future__ import annotations

import importlib
import json
import pathlib
import sys
import time
import traceback
from typing import Any

from ortserve.bench.backends.base import Spec
from ortserve.bench.measure import PeakRSS, summarize_rep
from ortserve.bench.workload import PromptSet


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_backend(target: str, spec: Spec) -> Any:
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(spec)


def run_cell(backend: Any, prompts: PromptSet, batch: int, length: int, gen: int, warmup: int,
             reps: int) -> dict[str, Any]:
    cell: dict[str, Any] = {"batch": batch, "prompt_length": length, "reps": []}
    with PeakRSS(backend.pids) as rss:
        for r in range(warmup + reps):
            batch_prompts = [prompts.get(length, r * batch + i) for i in range(batch)]
            timings = backend.run(batch_prompts, gen)
            if r >= warmup:
                cell["reps"].append(summarize_rep(timings))
    cell["peak_rss"] = rss.peak
    return cell


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    spec = Spec(**job["spec"])
    prompts = PromptSet.from_json(job["prompts"])
    w = job["workload"]
    out: dict[str, Any] = {"backend": job["backend"], "cells": []}
    t0 = time.perf_counter()
    backend = load_backend(job["target"], spec)
    out["load_seconds"] = time.perf_counter() - t0
    try:
        out["info"] = backend.info()
        for batch, length in job["cells"]:
            say(f"  {job['backend']}: batch {batch}, prompt {length} tokens, "
                f"{w['warmup']} warm-up + {w['reps']} reps of {w['gen_tokens']} tokens")
            try:
                out["cells"].append(run_cell(backend, prompts, batch, length, w["gen_tokens"],
                                             w["warmup"], w["reps"]))
            except Exception as exc:  # noqa: BLE001 - one failing cell must not lose the others
                out["cells"].append({"batch": batch, "prompt_length": length, "reps": [],
                                     "error": f"{type(exc).__name__}: {exc}"[:500]})
                say(traceback.format_exc())
        if job.get("quality"):
            try:
                out["quality"] = backend.quality()
            except Exception as exc:  # noqa: BLE001
                out["quality"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        backend.close()
    return out


def main(argv: list[str]) -> int:
    job_path, result_path = argv[1], argv[2]
    with pathlib.Path(job_path).open(encoding="utf-8") as f:
        job = json.load(f)
    try:
        result = run_job(job)
    except Exception as exc:  # noqa: BLE001 - report it; the runner turns it into an "error" row
        say(traceback.format_exc())
        result = {"backend": job["backend"], "error": f"{type(exc).__name__}: {exc}"[:1000], "cells": []}
    with pathlib.Path(result_path).open("w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
