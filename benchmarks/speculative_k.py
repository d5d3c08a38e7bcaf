"""How far prompt lookup should guess (speculative_k), on a machine too noisy for wall-clock alone.

Two measurements in one run, on the default model (or --model), over benchmarks/speculative.py's
three workloads (RAG quote, JSON edit, free text), greedy, one stream:

- **modeled**: greedy decoding is deterministic, so each k's sequence of steps (verify steps of k_i
  guesses, plain decode steps) is recorded, and its cost is sum c_v(k_i)/c_t + decode steps, with
  c_v(k)/c_t the verify step's cost against a decode step, measured here (medians, interleaved).
  Tokens per unit cost, against speculation off, is the speedup the machine's noise cannot move.
- **wall clock**: decode tok/s of each k and of speculation off, interleaved (order reversed every
  other rep), medians of the per-rep ratios.

    .venv/bin/python benchmarks/speculative_k.py --ks 4,8,16 --gen 64 --reps 6
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np
from _common import emit, machine, median, model_dir
from speculative import WORKLOADS

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.types import SamplingParams


def verify_costs(eng: AsyncEngine, kmax: int, reps: int, context: int = 300) -> dict[int, float]:
    """c_v(k) / c_t for k = 1..kmax with ``context`` tokens in the row."""
    r = eng.model.runner
    ids = [int(t) for t in np.random.default_rng(0).integers(100, 20000, size=context)]
    r.prefill(0, ids, total=context + kmax + 2)
    times: dict[int, list[float]] = {k: [] for k in range(kmax + 1)}
    for _ in range(reps):
        for k, spent in times.items():
            t0 = time.perf_counter()
            r.decode(np.asarray([ids[-1]])) if k == 0 else r.verify([[ids[-1]] * (k + 1)])
            spent.append(time.perf_counter() - t0)
            r.keep(0, context)
    r.keep(0, 0)
    c_t = median(times[0])
    return {k: median(times[k]) / c_t for k in range(1, kmax + 1)}


def traced(eng: AsyncEngine, messages: list[dict[str, str]], params: SamplingParams) -> tuple[Any, list[int], int]:
    """The answer, the k of each verify step and the number of plain decode steps."""
    runner, ks, decodes = eng.core.runner, [], [0]
    verify, decode = runner.verify, runner.decode

    def spy_verify(fed: list[list[int]]) -> Any:
        ks.append(len(fed[0]) - 1)
        return verify(fed)

    def spy_decode(tokens: np.ndarray, start: int = 0) -> Any:
        decodes[0] += 1
        return decode(tokens, start)

    runner.verify, runner.decode = spy_verify, spy_decode  # type: ignore[method-assign]
    try:
        return asyncio.run(eng.generate(messages=messages, params=params)), ks, decodes[0]
    finally:
        runner.verify, runner.decode = verify, decode  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--ks", default="4,8,16", help="speculative_k values to compare")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=6, help="wall-clock reps per workload")
    ap.add_argument("--cost-reps", type=int, default=15)
    args = ap.parse_args()
    target, target_id = model_dir(args.model)
    ks = [int(k) for k in args.ks.split(",")]
    engines = {"off": AsyncEngine.load(target, load_settings(max_batch=1, prefix_cache=False, speculative=False))}
    for k in ks:
        engines[f"k{k}"] = AsyncEngine.load(target, load_settings(max_batch=1, prefix_cache=False, speculative_k=k))
    cost = verify_costs(engines["off"], max(ks), args.cost_reps)
    out: dict[str, Any] = {"benchmark": "speculative_k", "machine": machine(), "model": target_id, "gen": args.gen,
                           "c_v/c_t": {str(k): round(v, 3) for k, v in cost.items()}, "workloads": {}}
    params = SamplingParams(temperature=0, max_tokens=args.gen)
    for e in engines.values():
        e.core.start()
    try:
        for name, messages in WORKLOADS.items():
            row: dict[str, Any] = {"modeled": {}, "steps": {}, "acceptance": {}}
            for label, eng in engines.items():
                res, vks, decodes = traced(eng, messages, params)
                units = sum(cost[k] for k in vks) + decodes
                row["modeled"][label] = (res.metrics.output_tokens - 1) / units
                row["steps"][label] = len(vks) + decodes
                row["acceptance"][label] = (res.metrics.speculative or {}).get("acceptance")
            off = row["modeled"]["off"]
            row["modeled"] = {k: round(v / off, 3) for k, v in row["modeled"].items() if k != "off"}
            tps: dict[str, list[float]] = {label: [] for label in engines}
            for rep in range(args.reps):
                for label in (list(engines) if rep % 2 == 0 else list(engines)[::-1]):
                    res = asyncio.run(engines[label].generate(messages=messages, params=params))
                    tps[label].append(res.metrics.output_tokens_per_second)
            row["wall_tps"] = {label: round(median(v), 2) for label, v in tps.items()}
            row["wall_vs_off"] = {label: round(median([a / b for a, b in zip(v, tps["off"])]), 3)
                                  for label, v in tps.items() if label != "off"}
            out["workloads"][name] = row
    finally:
        for e in engines.values():
            e.core.stop()
    emit(out)


if __name__ == "__main__":
    main()
