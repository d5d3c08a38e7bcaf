"""Where a batched decode step's time goes: session.run versus the engine around it (prints JSON).

    flock /work/bench.lock nice -n -10 .venv/bin/python benchmarks/batch_phases.py
        [--model ID_OR_DIR] [--streams 16] [--gen 128] [--reps 3] [--threads 2] [--spin]

``streams`` concurrent greedy requests of ``gen`` tokens each (the prompts of
``vs_llamacpp.py``'s parallel runs: 128-token slices of the held-out text). First ``reps``
uninstrumented rounds give the aggregate decode tokens/s as ``vs_llamacpp.py`` counts it; then
``reps`` instrumented rounds time every engine step whose decode batch held all ``streams``
rows: the whole step (``core.step``: schedule, decode, retire), the ``session.run`` inside it,
and the per-row phases (``sample``, ``accept`` = detokenize + stop strings, ``emit`` = event
to the asyncio loop). ``engine_share`` is the step's time outside ``session.run``: what the
engine could still win. Issue 22 asks for 16 streams >= 2.0x llama-batched-bench; this shows
how much of that step is the kernels'.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from _common import emit, machine, median, model_dir
from engine_overhead import Phases
from vs_llamacpp import engine_parallel, heldout_text, parallel_prompts

import ortserve.engine.postprocess as core_mod  # the module whose sample() a step calls
from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.engine.sequence import Sequence


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spin", action="store_true", help="let ONNX Runtime threads spin")
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    n = args.streams
    engine = AsyncEngine.load(path, load_settings(max_batch=n, intra_op_threads=args.threads,
                                                  thread_spinning=args.spin))
    prompts = parallel_prompts(engine, engine.codec.encode(heldout_text(), add_special_tokens=False), n)
    result: dict[str, Any] = {"benchmark": "batch_phases", "model": mid, "machine": machine(), "streams": n,
                              "gen": args.gen, "reps": args.reps, "threads": args.threads, "spinning": args.spin}

    async def run() -> None:
        await engine.start()
        await engine_parallel(engine, prompts, 8)  # warm-up
        result["aggregate_tps"] = [await engine_parallel(engine, prompts, args.gen) for _ in range(args.reps)]
        core = engine.core
        phases = Phases()
        full: list[tuple[float, float]] = []  # (step, session.run) for steps decoding all n rows
        last_run: list[float] = []
        decode = core.runner.decode

        def timed_decode(tokens: Any, start: int = 0) -> Any:
            t = time.perf_counter()
            try:
                return decode(tokens, start)
            finally:
                if len(tokens) == n:
                    last_run.append(time.perf_counter() - t)

        def timed_step(step: Callable[[], None]) -> Callable[[], None]:
            def wrapper() -> None:
                last_run.clear()
                t = time.perf_counter()
                step()
                if last_run:
                    full.append((time.perf_counter() - t, last_run[0]))
            return wrapper

        orig_sample, orig_accept = core_mod.sample, Sequence.accept
        core.runner.decode = timed_decode  # type: ignore[method-assign]
        core.step = timed_step(core.step)  # type: ignore[method-assign]
        core._emit = phases.timed("emit", core._emit)  # type: ignore[method-assign]
        core_mod.sample = phases.timed("sample", orig_sample)
        Sequence.accept = phases.timed("accept", orig_accept)  # type: ignore[method-assign]
        try:
            result["instrumented_tps"] = [await engine_parallel(engine, prompts, args.gen)
                                          for _ in range(args.reps)]
        finally:
            del core.runner.decode, core.step, core._emit
            core_mod.sample, Sequence.accept = orig_sample, orig_accept  # type: ignore[method-assign]
        await engine.stop()
        steps = len(full)
        step_s = sum(s for s, _ in full)
        run_s = sum(r for _, r in full)
        result["full_steps"] = steps
        result["ms_per_step"] = {"step": round(1e3 * step_s / steps, 2), "session_run": round(1e3 * run_s / steps, 2),
                                 "engine": round(1e3 * (step_s - run_s) / steps, 2),
                                 "step_median": round(1e3 * median([s for s, _ in full]), 2),
                                 "session_run_median": round(1e3 * median([r for _, r in full]), 2)}
        # the per-row phases are summed over every step (also the ramp-up and tail ones)
        total_rows = phases.calls["sample"] or 1
        result["us_per_row"] = {k: round(1e6 * v / total_rows, 1) for k, v in phases.seconds.items()}
        result["engine_share"] = round((step_s - run_s) / step_s, 4)
        result["tps_if_engine_were_free"] = round(n / (run_s / steps), 1)

    asyncio.run(run())
    emit(result)


if __name__ == "__main__":
    main()
