"""Where one greedy stream's time goes: session.run versus each engine phase (prints JSON).

    .venv/bin/python benchmarks/engine_overhead.py [--model ID_OR_DIR] [--gen 128] [--reps 5]
                                                   [--threads 0] [--spin] [--no-og] [--og-first]

Three decoders run on the same model, prompt and session options, alternating rep by rep
so a change in machine load does not tilt the ratios:

- ``runner``: the floor. The engine's own Runner in a bare loop: ``decode`` (one
  ``session.run`` with the bound KV cache) then ``argmax``. Nothing else.
- ``engine``: ortserve's AsyncEngine as the server drives it (engine thread, sampler,
  detokenizer, stop matcher, events to asyncio), uninstrumented.
- ``og``: raw ``og.Generator`` on the same model directory (its own session).

Then one instrumented engine run splits each step into phases (``session_run``, ``sample``,
``accept`` = detokenize + stop strings, ``emit`` = event to the asyncio loop, ``rest`` =
the loop itself: mask, bookkeeping, locks). Target (issue 22): engine >= 0.97 x runner.
The tokens must match: the benchmark fails if the engine's greedy text differs from the
bare loop's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import QUESTIONS, RawOg, emit, machine, median, model_dir

import ortserve.engine.postprocess as core_mod  # the module whose sample() a step calls
from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.engine.sequence import Sequence
from ortserve.types import SamplingParams


def bare_loop(engine: AsyncEngine, ids: list[int], gen: int) -> tuple[float, float, list[int]]:
    """The floor: prefill, then ``gen - 1`` decode steps of session.run + argmax (EOS masked).
    Returns (decode tok/s, session.run share of the decode time, tokens)."""
    runner = engine.model.runner
    eos = list(runner.spec.eos_token_ids)  # masked, as ignore_eos does in the engine
    # the engine thread may still be ending the step that finished its last request (retiring,
    # shrinking the idle cache): the runner is shared, so wait until that step is over
    while engine.core.step_started is not None or engine.core.running:
        time.sleep(0.001)

    def pick(logits: np.ndarray) -> int:
        logits[eos] = -np.inf
        return int(np.argmax(logits))

    tok = pick(runner.prefill(0, ids).copy())
    out = [tok]
    in_run = 0.0
    t0 = time.perf_counter()
    for _ in range(gen - 1):
        t = time.perf_counter()
        logits = runner.decode(np.array([tok], dtype=np.int64))
        in_run += time.perf_counter() - t
        tok = pick(logits[0])
        out.append(tok)
    wall = time.perf_counter() - t0
    runner.clear(0)
    return (gen - 1) / wall, in_run / wall, out


class Phases:
    """Wraps the engine's per-step calls with timers (only for the instrumented run)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds[name] += time.perf_counter() - t
                self.calls[name] += 1
        return wrapper


async def engine_run(engine: AsyncEngine, question: str, gen: int) -> tuple[float, str]:
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    out = await engine.generate(messages=[{"role": "user", "content": question}], params=params)
    return out.metrics.output_tokens_per_second, out.text


async def instrumented(engine: AsyncEngine, question: str, gen: int) -> dict[str, Any]:
    core = engine.core
    phases = Phases()
    orig = {"decode": core.runner.decode, "sample": core_mod.sample, "accept": Sequence.accept,
            "emit": core._emit}
    core.runner.decode = phases.timed("session_run", orig["decode"])  # type: ignore[method-assign]
    core_mod.sample = phases.timed("sample", orig["sample"])
    Sequence.accept = phases.timed("accept", orig["accept"])  # type: ignore[method-assign]
    core._emit = phases.timed("emit", orig["emit"])  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        tps, _ = await engine_run(engine, question, gen)
        wall = time.perf_counter() - t0
    finally:
        del core.runner.decode, core._emit
        core_mod.sample, Sequence.accept = orig["sample"], orig["accept"]  # type: ignore[method-assign]
    steps = phases.calls["session_run"]
    per_step = {k: v / steps * 1e6 for k, v in phases.seconds.items()}
    decode_wall = (gen - 1) / tps
    per_step["rest"] = decode_wall / steps * 1e6 - sum(per_step.values())
    return {"steps": steps, "decode_tps": tps, "us_per_step": {k: round(v, 1) for k, v in per_step.items()},
            "share": {k: round(v / sum(per_step.values()), 4) for k, v in per_step.items()},
            "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    ap.add_argument("--spin", action="store_true", help="let ONNX Runtime threads spin")
    ap.add_argument("--no-og", action="store_true", help="skip raw og.Generator")
    ap.add_argument("--og-first", action="store_true", help="load og's session before the engine's")
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    settings = load_settings(max_batch=1, intra_op_threads=args.threads, thread_spinning=args.spin)
    # og gets the same intra-op thread count (a genai_config overlay); its spinning is its own.
    # Load order matters: of two sessions in one process, the one created first decoded ~10%
    # slower in issue 22's runs (docs/bench.md), so --og-first swaps the order to show it.
    raw = RawOg(path, args.threads) if args.og_first and not args.no_og else None
    engine = AsyncEngine.load(path, settings)
    question = QUESTIONS[0]
    ids, _ = engine.prepare(messages=[{"role": "user", "content": question}])
    if raw is None and not args.no_og:
        raw = RawOg(path, args.threads)

    async def run() -> dict[str, Any]:
        await engine.start()
        await engine_run(engine, question, 8)  # warm-up
        bare_loop(engine, ids, 8)
        runs: dict[str, list[float]] = {"runner": [], "engine": [], "og": []}
        run_share: list[float] = []
        same_tokens = True
        for _ in range(args.reps):
            tps, share, toks = bare_loop(engine, ids, args.gen)
            runs["runner"].append(tps)
            run_share.append(share)
            tps, text = await engine_run(engine, question, args.gen)
            runs["engine"].append(tps)
            same_tokens &= text == engine.codec.decode(toks)
            if raw is not None:
                runs["og"].append(raw.single(list(ids), args.gen)["decode_tps"])
        phases = await instrumented(engine, question, args.gen)
        await engine.stop()
        ratios = [e / r for e, r in zip(runs["engine"], runs["runner"])]
        out: dict[str, Any] = {
            "decode_tps": {k: {"min": min(v), "median": median(v), "max": max(v)} for k, v in runs.items() if v},
            "engine_vs_runner": {"min": min(ratios), "median": median(ratios), "max": max(ratios)},
            "session_run_share_of_bare_loop": median(run_share),
            "same_greedy_tokens": same_tokens, "instrumented_engine": phases}
        if runs["og"]:
            og = [e / o for e, o in zip(runs["engine"], runs["og"])]
            out["engine_vs_og"] = {"min": min(og), "median": median(og), "max": max(og)}
            rog = [r / o for r, o in zip(runs["runner"], runs["og"])]
            out["runner_vs_og"] = {"min": min(rog), "median": median(rog), "max": max(rog)}
        out["targets_met"] = {"engine>=0.97x_runner": out["engine_vs_runner"]["median"] >= 0.97}
        return out

    result = {"benchmark": "engine_overhead", "model": mid, "model_dir": str(path), "machine": machine(),
              "gen_tokens": args.gen, "reps": args.reps, "prompt_tokens": len(ids),
              "threads": args.threads or os.cpu_count(), "spinning": args.spin,
              "huge_page_mb": engine.model.runner.huge_page_bytes >> 20, "og_loaded_first": args.og_first}
    result.update(asyncio.run(run()))
    result["loadavg_at_end"] = os.getloadavg()
    emit(result)
    if not result["same_greedy_tokens"]:
        raise SystemExit("engine and bare loop disagree on greedy tokens")


if __name__ == "__main__":
    main()
