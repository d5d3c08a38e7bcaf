"""Kernel time per decode step by node kind, from ONNX Runtime's own profiler (prints JSON).

    .venv/bin/python benchmarks/op_profile.py [--model ID_OR_DIR] [--steps 64] [--threads 1]

Runs the engine's Runner (prefill 40 tokens, then ``--steps`` greedy decode steps) with
``enable_profiling`` and sums the ``*_kernel_time`` events of the decode steps by kind. The
exact GGUF import's extra nodes are split out: ``minimum_term`` (block sums @ offsets),
``minimum_add`` and ``block_sums``; ``lm_head`` is the 8-bit LM head. Shares are of the
summed kernel time, so they hold up better under machine load than absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort
from _common import emit, machine, model_dir

from ortserve.engine.runner import ModelSpec, Runner


def kind(name: str, op: str) -> str:
    if "gguf_blocksum" in name:
        return "block_sums"
    if name.endswith("/gguf_min"):
        return "minimum_term"
    if name.endswith("/gguf_add"):
        return "minimum_add"
    if "lm_head" in name:
        return "lm_head"
    return op


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = args.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ortserve-ops")
    runner = Runner(ModelSpec.read(path), slots=1, session_options=so)
    tok = int(np.argmax(runner.prefill(0, list(range(100, 140)))))
    for _ in range(args.steps):
        tok = int(np.argmax(runner.decode(np.array([tok], dtype=np.int64))[0]))
    trace = Path(runner.session.end_profiling())
    events = json.loads(trace.read_text(encoding="utf-8"))
    trace.unlink()
    runs = [e for e in events if e.get("name") == "model_run"][-args.steps:]
    start = runs[0]["ts"]
    us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") == "Node" and e["ts"] >= start and e["name"].endswith("_kernel_time"):
            k = kind(e["name"].removesuffix("_kernel_time"), e["args"]["op_name"])
            us[k] += e["dur"]
            count[k] += 1
    total = sum(us.values())
    rows = sorted(us, key=lambda k: -us[k])
    emit({"benchmark": "op_profile", "model": mid, "machine": machine(), "threads": args.threads,
          "steps": args.steps, "model_run_us_median": float(np.median([e["dur"] for e in runs])),
          "kernels": {k: {"us_per_step": round(us[k] / args.steps, 1), "share": round(us[k] / total, 4),
                          "nodes_per_step": count[k] // args.steps} for k in rows},
          "loadavg_at_end": os.getloadavg()})


if __name__ == "__main__":
    main()
