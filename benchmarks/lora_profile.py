"""Where a LoRA decode step's time goes (docs/lora.md "Cost"); prints JSON.

    .venv/bin/python benchmarks/lora_profile.py [--model smollm2-135m] [--rank 16] [--steps 40] [--rounds 5]

The runner alone (no scheduler, no sampling): decode steps of the base runner (no LoRA edit)
against the LoRA runner, interleaved in rounds (A, B, A, B...) so that a shared machine's load
falls on both; each figure is the median step time over every round. Cases: one row with one
adapter (the one-adapter binding), and ``--rows`` rows over ``--adapters`` adapters (the mixed
binding). Then one profiled run of each (onnxruntime's profiler, ``SessionOptions.enable_profiling``)
sums the kernel time per op type, the LoRA edit's nodes (named ``/ortserve/lora/...``) apart from
the base's, and the bytes each step reads: the base's weights against the adapters' stacks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, machine, model_dir
from lora import random_adapters

from ortserve.engine.runner import ModelSpec, Runner
from ortserve.engine.runtime import session_options

PROMPT = list(range(100, 164))


def runner(spec: ModelSpec, rows: int, lora: bool, adapters: list, mode: str, profile: str | None = None) -> Runner:
    so = session_options(None, spec.session_options)
    if profile is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    r = Runner(spec, slots=rows, session_options=so, lora=lora, lora_mode=mode)
    if lora:
        r.set_adapters(adapters)
    for row in range(rows):
        if lora:
            r.use_adapter(row, adapters[row % len(adapters)].name if adapters else "")
        r.prefill(row, PROMPT)
    return r


def steps(r: Runner, rows: int, n: int) -> list[float]:
    out = []
    toks = np.full(rows, 42, dtype=np.int64)
    for _ in range(n):
        t0 = time.perf_counter()
        r.decode(toks)
        out.append(time.perf_counter() - t0)
    r.lengths[:rows] = len(PROMPT)  # the same positions every round: equal work
    return out


def ab(spec: ModelSpec, rows: int, adapters: list, mode: str, n: int, rounds: int) -> dict[str, Any]:
    base, lora = runner(spec, rows, False, [], mode), runner(spec, rows, True, adapters, mode)
    steps(base, rows, 3), steps(lora, rows, 3)  # warm-up
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        a += steps(base, rows, n)
        b += steps(lora, rows, n)
    ma, mb = statistics.median(a), statistics.median(b)
    return {"rows": rows, "adapters": len(adapters), "base_ms": round(ma * 1e3, 3), "lora_ms": round(mb * 1e3, 3),
            "overhead": round(mb / ma - 1, 4)}


def profile(spec: ModelSpec, rows: int, adapters: list, mode: str, n: int) -> dict[str, Any]:
    """Kernel microseconds per step, per op type, LoRA nodes apart."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, lora in (("base", False), ("lora", True)):
            r = runner(spec, rows, lora, adapters if lora else [], mode, profile=str(Path(tmp) / name))
            steps(r, rows, n)
            path = r.session.end_profiling()
            per: dict[str, float] = defaultdict(float)
            events = json.loads(Path(path).read_text(encoding="utf-8"))
            runs = sorted((ev["ts"], ev["ts"] + ev["dur"]) for ev in events if ev.get("name") == "model_run")
            runs = runs[rows:]  # the first ``rows`` runs were the prefills
            for ev in events:
                if ev.get("cat") != "Node" or not ev["name"].endswith("_kernel_time"):
                    continue
                if not any(a <= ev["ts"] <= b for a, b in runs):
                    continue
                op = ev["args"].get("op_name", "?")
                who = "lora" if ev["name"].startswith("/ortserve/lora") else "base"
                per[f"{who}:{op}"] += ev["dur"]
            steps_run = len(runs)
            out[name] = {k: round(v / steps_run) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}
            out[name + "_total_us"] = round(sum(per.values()) / steps_run)
            if lora:
                out["lora_nodes_us"] = round(sum(v for k, v in per.items() if k.startswith("lora:")) / steps_run)
    return out


def stack_bytes(r: Runner, one: bool) -> int:
    inputs = r._lora.single[1][0] if one else r._lora.all  # type: ignore[union-attr]
    return int(sum(v.numpy().nbytes for v in inputs.values()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mode", default="mask")
    args = ap.parse_args()
    path, model_id = model_dir(args.model)
    spec = ModelSpec.read(path)
    adapters = random_adapters(path, args.adapters, args.rank)
    probe = runner(spec, 1, True, adapters, args.mode)
    weights = sum(f.stat().st_size for f in path.glob("*.onnx*"))
    result = {"machine": machine(), "model": model_id, "rank": args.rank, "mode": args.mode,
              "bytes": {"base_weight_files": weights, "one_adapter_stacks": stack_bytes(probe, True),
                        "all_adapter_stacks": stack_bytes(probe, False)},
              "single": ab(spec, 1, adapters[:1], args.mode, args.steps, args.rounds),
              "mixed": ab(spec, args.rows, adapters, args.mode, max(4, args.steps // 4), args.rounds),
              "profile_single": profile(spec, 1, adapters[:1], args.mode, args.steps),
              "profile_mixed": profile(spec, args.rows, adapters, args.mode, max(4, args.steps // 4))}
    emit(result)


if __name__ == "__main__":
    main()
