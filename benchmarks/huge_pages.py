"""Decode step time with the model's weights in transparent huge pages vs 4 KB pages (prints JSON).

    .venv/bin/python benchmarks/huge_pages.py [--model ID_OR_DIR] [--pairs 3] [--gen 128] [--reps 3]
                                              [--threads 2] [--spin]

Huge pages cannot be switched off again inside one process (the kernel does not split a
collapsed page on request), and two sessions in one process are not equal either: the
session created first decoded ~10% slower in this session's runs (docs/bench.md). So each
side runs in its own fresh process, the sides alternate (``--pairs`` of off/on), and each
process runs the engine's bare Runner (prefill, then ``session.run`` + ``argmax`` per token)
``--reps`` times. Per process it reports the 10th percentile and the median of the per-step
wall times: on a busy machine the 10th percentile is the step that no other process
interrupted. Ratios are off / on per pair (above 1: huge pages are faster). Greedy tokens
must match between the two sides.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import emit, machine, median, model_dir, pct


def child(args: argparse.Namespace) -> None:
    import numpy as np

    from ortserve.config import load_settings
    from ortserve.engine.huge_pages import huge_page_bytes
    from ortserve.engine.runner import ModelSpec, Runner
    from ortserve.engine.runtime import session_options

    path, _ = model_dir(args.model)
    so = session_options(load_settings(intra_op_threads=args.threads, thread_spinning=args.spin))
    t = time.perf_counter()
    runner = Runner(ModelSpec.read(path), slots=1, session_options=so, huge_pages=args.child == "on")
    load_s = time.perf_counter() - t
    ids = list(range(200, 260))
    steps: list[float] = []
    tokens: list[int] = []
    for rep in range(args.reps + 1):  # the first is a warm-up
        tok = int(np.argmax(runner.prefill(0, ids)))
        out = [tok]
        for _ in range(args.gen - 1):
            t = time.perf_counter()
            tok = int(np.argmax(runner.decode(np.array([tok], dtype=np.int64))[0]))
            if rep:
                steps.append(time.perf_counter() - t)
            out.append(tok)
        runner.clear(0)
        tokens = out
    print(json.dumps({"huge_pages": args.child == "on", "advised_mb": runner.huge_page_bytes >> 20,
                      "process_huge_page_mb": huge_page_bytes() >> 20, "load_s": round(load_s, 2),
                      "step_ms_p10": round(pct(steps, 0.10) * 1e3, 3), "step_ms_median": round(median(steps) * 1e3, 3),
                      "tokens": tokens}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spin", action="store_true", help="let ONNX Runtime threads spin")
    ap.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    start = machine()
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for i in range(args.pairs):
        for side in (("off", "on") if i % 2 == 0 else ("on", "off")):
            cmd = [sys.executable, __file__, "--child", side, "--gen", str(args.gen), "--reps", str(args.reps),
                   "--threads", str(args.threads)] + (["--spin"] if args.spin else []) + \
                  (["--model", args.model] if args.model else [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[side].append(json.loads(out.strip().splitlines()[-1]))
    ratio = {k: [a[k] / b[k] for a, b in zip(runs["off"], runs["on"])] for k in ("step_ms_p10", "step_ms_median")}
    tokens = {json.dumps(r.pop("tokens")) for side in runs.values() for r in side}
    emit({"benchmark": "huge_pages", "machine": start, "threads": args.threads, "spinning": args.spin,
          "gen_tokens": args.gen, "reps_per_process": args.reps, "runs": runs,
          "speedup_off_over_on": {k: {"min": min(v), "median": median(v), "max": max(v)} for k, v in ratio.items()},
          "same_greedy_tokens": len(tokens) == 1, "loadavg_at_end": os.getloadavg()})
    if len(tokens) != 1:
        raise SystemExit("greedy tokens differ between 4 KB and huge pages")


if __name__ == "__main__":
    main()
