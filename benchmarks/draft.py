"""Draft-model speculation, for cost (docs/speculative.md): the step costs that decide its speedup,
measured on the target (the default model unless --model) and random-weight drafts of its vocabulary
built here with the tests' tiny-Llama route, and the expected speedup as a formula of the acceptance
rate alpha (a random draft's acceptance says nothing about a trained one's):

    E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)  /  ((k * c_d + c_v(k)) / c_t)

c_t: one target decode step; c_v(k): one target verify step feeding k+1 tokens; c_d: one draft decode
step (its catch-up step, 1 to k+1 tokens, costs about one step too, so a round of k guesses is k
draft calls). All at the same context length (--context tokens already in the row), medians over
--reps steps, interleaved so a busy machine's drift hits all alike.

End to end through the engine (greedy, free text, --gen tokens, draft only: speculative_lookup off):
draft = target (alpha about 1, the sanity point: the formula with c_d = c_t) and the random draft
(alpha about 0: what a useless draft costs once adaptive k and the back-off have their say), each
against speculation off in the same run.

    .venv/bin/python benchmarks/draft.py --drafts 2x256,4x256
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, machine, median, model_dir

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.types import SamplingParams

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
STORY = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a map."}]


def build_draft(target: Path, layers: int, hidden: int, precision: str, out: Path) -> Path:
    """A random-weight Llama with the target's tokenizer (so its vocabulary), ONNX at ``precision``."""
    from ortserve.models.convert import build_onnx, make_tiny_llama

    hf = make_tiny_llama(out / "hf", target, layers=layers, hidden=hidden, seed=1)
    return build_onnx(hf, out / "model", precision=precision)


def step_costs(eng: AsyncEngine, context: int, reps: int, ks: range) -> dict[str, Any]:
    """Medians in ms: target decode c_t, target verify c_v(k), draft decode c_d, at ``context`` tokens."""
    target, draft = eng.model.runner, eng.model.draft
    assert draft is not None
    vocab = target.spec.vocab_size
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(100, 20000, size=context)]
    target.prefill(0, ids, total=context + max(ks) + 2)
    draft.propose(ids, 1, vocab)  # the draft's row holds the same context
    d_run = draft.runner
    times: dict[str, list[float]] = {"c_t": [], "c_d": [], **{f"c_v({k})": [] for k in ks}}
    for _ in range(reps):
        for k in ks:
            t0 = time.perf_counter()
            target.verify([[ids[-1]] * (k + 1)])
            times[f"c_v({k})"].append(time.perf_counter() - t0)
            target.keep(0, context)
        t0 = time.perf_counter()
        target.decode(np.asarray([ids[-1]]))
        times["c_t"].append(time.perf_counter() - t0)
        target.keep(0, context)
        t0 = time.perf_counter()
        d_run.decode(np.asarray([ids[-1]]))
        times["c_d"].append(time.perf_counter() - t0)
        d_run.keep(0, context)
    draft.forget()
    target.keep(0, 0)
    return {name: round(median(xs) * 1000, 3) for name, xs in times.items()}


def expected(costs: dict[str, float], ks: range) -> dict[str, Any]:
    """E(alpha, k) for each alpha and k, and the best k per alpha."""
    c_t, c_d = costs["c_t"], costs["c_d"]
    table: dict[str, Any] = {}
    for a in ALPHAS:
        row = {k: (1 - a ** (k + 1)) / (1 - a) / ((k * c_d + costs[f"c_v({k})"]) / c_t) for k in ks}
        best = max(row, key=lambda k: row[k])
        table[str(a)] = {"by_k": {str(k): round(v, 3) for k, v in row.items()}, "best_k": best,
                         "best_speedup": round(row[best], 3)}
    return table


def end_to_end(target: Path, draft: tuple[Path, str] | None, gen: int, reps: int, k: int) -> dict[str, Any]:
    """Decode tok/s with the draft on (draft only) and speculation off, interleaved, one stream."""
    common = {"max_batch": 1, "prefix_cache": False, "speculative_k": k}
    on = AsyncEngine.load(target, load_settings(speculative_lookup=False, **common), draft=draft)
    off = AsyncEngine.load(target, load_settings(speculative=False, **common))
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    res: dict[str, list[Any]] = {"on": [], "off": [], "spec": [], "same": []}
    try:
        on.core.start()
        off.core.start()
        for _ in range(reps):
            a = asyncio.run(on.generate(messages=STORY, params=params))
            b = asyncio.run(off.generate(messages=STORY, params=params))
            res["on"].append(a.metrics.output_tokens_per_second)
            res["off"].append(b.metrics.output_tokens_per_second)
            res["spec"].append((a.metrics.speculative or {}).get("draft"))
            res["same"].append(a.text == b.text)
    finally:
        on.core.stop()
        off.core.stop()
    tps_on, tps_off = median(res["on"]), median(res["off"])
    return {"tps_on": round(tps_on, 2), "tps_off": round(tps_off, 2), "ratio": round(tps_on / tps_off, 3),
            "draft_stats": res["spec"][-1], "greedy_identical": all(res["same"])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="target (default: the default model)")
    ap.add_argument("--drafts", default="2x256,4x256", help="random drafts to build, LAYERSxHIDDEN, comma-separated")
    ap.add_argument("--precision", default="int4", help="the drafts' ONNX precision (int4, int8, fp32)")
    ap.add_argument("--context", type=int, default=256, help="tokens in the row when steps are timed")
    ap.add_argument("--reps", type=int, default=20, help="timed steps per cost")
    ap.add_argument("--kmax", type=int, default=8)
    ap.add_argument("--gen", type=int, default=64, help="tokens per end-to-end answer")
    ap.add_argument("--e2e-reps", type=int, default=2)
    args = ap.parse_args()
    target, target_id = model_dir(args.model)
    ks = range(1, args.kmax + 1)
    out: dict[str, Any] = {"benchmark": "draft", "machine": machine(), "target": target_id,
                           "context": args.context, "formula": "E = (1-a^(k+1))/(1-a) / ((k*c_d + c_v(k))/c_t)",
                           "drafts": {}}
    settings = load_settings(max_batch=1, prefix_cache=False)
    with tempfile.TemporaryDirectory(prefix="ortserve-draft-") as tmp:
        for spec in args.drafts.split(","):
            layers, hidden = (int(x) for x in spec.lower().split("x"))
            t0 = time.perf_counter()
            d_dir = build_draft(target, layers, hidden, args.precision, Path(tmp) / spec)
            built = time.perf_counter() - t0
            eng = AsyncEngine.load(target, settings, target_id, draft=(d_dir, f"random-{spec}"))
            costs = step_costs(eng, args.context, args.reps, ks)
            del eng  # its sessions go before the end-to-end engines load
            size = sum(f.stat().st_size for f in d_dir.glob("*.onnx*"))
            out["drafts"][spec] = {"layers": layers, "hidden": hidden, "precision": args.precision,
                                   "onnx_mb": round(size / 2**20, 1), "build_s": round(built, 1),
                                   "costs_ms": costs, "c_d/c_t": round(costs["c_d"] / costs["c_t"], 3),
                                   "expected_speedup": expected(costs, ks),
                                   "end_to_end_random_draft": end_to_end(target, (d_dir, spec), args.gen,
                                                                         args.e2e_reps, min(4, args.kmax))}
        # the sanity point: the target as its own draft accepts (almost) everything
        eng = AsyncEngine.load(target, settings, target_id, draft=(target, target_id))
        costs = step_costs(eng, args.context, args.reps, ks)
        del eng
        e2e = end_to_end(target, (target, target_id), args.gen, args.e2e_reps, min(4, args.kmax))
        alpha = (e2e["draft_stats"] or {}).get("acceptance", 1.0)
        k = min(4, args.kmax)
        predicted = (k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)) / (
            (k * costs["c_d"] + costs[f"c_v({k})"]) / costs["c_t"])
        out["draft_is_target"] = {"costs_ms": costs, "end_to_end": e2e, "k": k,
                                  "predicted_speedup_at_measured_alpha": round(predicted, 3)}
    out["threads"] = os.cpu_count()
    emit(out)


if __name__ == "__main__":
    main()
