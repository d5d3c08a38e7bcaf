"""Where one greedy stream's time goes: session.run versus each engine phase (prints JSON).

    .venv/bin/python benchmarks/engine_overhead.py [--model ID_OR_DIR] [--gen 128] [--reps 5]
                                                   [--threads 0] [--spin] [--no-og] [--og-first]
                                                   [--speculative]

Three decoders run on the same model, prompt and session options, alternating rep by rep
so a change in machine load does not tilt the ratios:

- ``runner``: the floor. The engine's own Runner in a bare loop: ``decode`` (one
  ``session.run`` with the bound KV cache) then ``argmax``. Nothing else.
- ``engine``: ortserve's AsyncEngine as the server drives it (engine thread, sampler,
  detokenizer, stop matcher, events to asyncio), uninstrumented; speculation and the prefix
  cache off (``--speculative`` turns speculation on), so every decoder runs one token a step.
- ``og``: raw ``og.Generator`` on the same model directory (its own session). og's threads
  spin (ONNX Runtime's default); the engine's and the runner's only with ``--spin``: compare
  like with like (docs/native.md, the engine's per-step cost).

Then one instrumented engine run times every per-step call, exclusive of the calls inside it
(``parts``: wall and the engine thread's CPU, per decode step): ``session_run``, ``runner`` (the
runner's Python around it), ``sample``, ``select`` (logits processors), ``detokenize``,
``stop_strings``, ``accept``, ``emit`` (the event to the asyncio loop), ``postprocess``,
``schedule``, ``masks``, ``retire``, ``account``, ``step`` (the rest of the step) and ``gap``
(the loop between steps); beside them the CPU per step of the asyncio thread and of the other
threads (ONNX Runtime's workers). ``us_per_step``/``share`` keep the older five-way summary.
Target (issue 22): engine >= 0.97 x runner. The tokens must match: the benchmark fails if the
engine's greedy text differs from the bare loop's.
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
from ortserve.engine.detokenize import IncrementalDetokenizer, StopMatcher
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
    """Nested timers around the engine's per-step calls (only for the instrumented run).

    Each wrapped call adds its wall and thread-CPU time to its own part *exclusive* of the wrapped
    calls inside it, so the parts add up to the steps (``step`` itself: what the step does between
    the wrapped calls). ``gap``: the engine thread between two steps (the loop's lock and wake-up)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list[float]] = []  # [wall, cpu] of the wrapped calls inside each open call
        self._last_end: tuple[float, float] | None = None  # (wall, cpu) when the last step ended
        self._in_prefill = False

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            if self._in_prefill:  # all of a prefill (its session run, its first token) counts as prefill
                return fn(*a, **kw)
            self._in_prefill = name == "prefill"
            w, c = time.perf_counter(), time.thread_time()
            if name == "step" and self._last_end is not None:
                self.wall["gap"] += w - self._last_end[0]
                self.cpu["gap"] += c - self._last_end[1]
            self._stack.append([0.0, 0.0])
            try:
                return fn(*a, **kw)
            finally:
                w, c = time.perf_counter() - w, time.thread_time() - c
                self._in_prefill = False
                inner = self._stack.pop()
                self.wall[name] += w - inner[0]
                self.cpu[name] += c - inner[1]
                self.calls[name] += 1
                if self._stack:
                    self._stack[-1][0] += w
                    self._stack[-1][1] += c
                if name == "step":
                    self._last_end = (time.perf_counter(), time.thread_time())
        return wrapper


async def engine_run(engine: AsyncEngine, question: str, gen: int) -> tuple[float, str]:
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    out = await engine.generate(messages=[{"role": "user", "content": question}], params=params)
    return out.metrics.output_tokens_per_second, out.text


# the parts of a step (Phases names) each wrapped call is counted in, and the old summary's five
_SUMMARY = {"session_run": ("runner", "session_run"), "sample": ("sample",),
            "accept": ("accept", "detokenize", "stop_strings"), "emit": ("emit",)}


async def instrumented(engine: AsyncEngine, question: str, gen: int) -> dict[str, Any]:
    """One engine run with every per-step call timed (wall and the calling thread's CPU), per decode
    step; the asyncio thread's CPU and the ONNX Runtime workers' (the rest of the process) beside."""
    core, runner = engine.core, engine.model.runner
    phases = Phases()
    on_core = {"step": "step", "_prefill": "prefill", "_speculate": "schedule", "_start_masks": "masks",
               "_wait_masks": "masks", "_postprocess": "postprocess", "select": "select", "_emit": "emit",
               "_retire_finished": "retire", "_account_decode": "account"}
    on_class = [(Sequence, "accept", "accept"), (IncrementalDetokenizer, "push", "detokenize"),
                (StopMatcher, "feed", "stop_strings")]
    for attr, name in on_core.items():
        setattr(core, attr, phases.timed(name, getattr(core, attr)))
    for attr in ("next_victim", "plan"):
        setattr(core.scheduler, attr, phases.timed("schedule", getattr(core.scheduler, attr)))
    runner.decode = phases.timed("runner", runner.decode)  # type: ignore[method-assign]
    runner.session.run_with_iobinding = phases.timed("session_run", runner.session.run_with_iobinding)
    # the general pick and the plain greedy one (absent before it existed: PYTHONPATH=<older tree>/src runs work)
    orig_sample, orig_greedy = core_mod.sample, getattr(core_mod, "greedy_unless", None)
    core_mod.sample = phases.timed("sample", orig_sample)
    if orig_greedy is not None:
        core_mod.greedy_unless = phases.timed("sample", orig_greedy)
    orig_class = [(cls, attr, getattr(cls, attr)) for cls, attr, _ in on_class]
    for cls, attr, name in on_class:
        setattr(cls, attr, phases.timed(name, getattr(cls, attr)))
    try:
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        tps, _ = await engine_run(engine, question, gen)
        wall, main_cpu, proc_cpu = time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0
    finally:
        for attr in on_core:
            delattr(core, attr)
        del core.scheduler.next_victim, core.scheduler.plan, runner.decode, runner.session.run_with_iobinding
        core_mod.sample = orig_sample
        if orig_greedy is not None:
            core_mod.greedy_unless = orig_greedy
        for cls, attr, fn in orig_class:
            setattr(cls, attr, fn)
    steps = phases.calls["runner"]
    decode = {k: v for k, v in phases.wall.items() if k != "prefill"}
    step_us = sum(decode.values()) / steps * 1e6
    parts = {k: {"us": round(v / steps * 1e6, 1), "share": round(v / steps * 1e6 / step_us, 4),
                 "cpu_us": round(phases.cpu[k] / steps * 1e6, 1)}
             for k, v in sorted(decode.items(), key=lambda kv: -kv[1])}
    engine_cpu = sum(v for k, v in phases.cpu.items() if k != "prefill")
    per_step = {k: sum(phases.wall[p] for p in ps) / steps * 1e6 for k, ps in _SUMMARY.items()}
    decode_wall = (gen - 1) / tps
    per_step["rest"] = decode_wall / steps * 1e6 - sum(per_step.values())
    return {"steps": steps, "decode_tps": tps, "us_per_step": {k: round(v, 1) for k, v in per_step.items()},
            "share": {k: round(v / sum(per_step.values()), 4) for k, v in per_step.items()},
            "parts": parts, "step_us": round(step_us, 1),
            "outside_session_run_share": round(1 - parts["session_run"]["share"], 4),
            "cpu_us_per_step": {"engine_thread": round(engine_cpu / steps * 1e6, 1),
                                "engine_thread_outside_session_run":
                                    round((engine_cpu - phases.cpu["session_run"]) / steps * 1e6, 1),
                                "asyncio_thread": round(main_cpu / steps * 1e6, 1),
                                "other_threads": round((proc_cpu - phases.cpu["prefill"] - engine_cpu - main_cpu)
                                                       / steps * 1e6, 1)},
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
    ap.add_argument("--speculative", action="store_true", help="prompt-lookup speculation on (the server's "
                    "default; off here: og and the bare loop decode one token a step)")
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    # prefix cache off: a later run would prefill only its prompt's last token on the cached KV, and
    # on the GGUF-native kernels that prefill rounds differently from the bare loop's whole-prompt one
    # (the greedy tokens then part at a near-tie); decode steps are the same either way
    settings = load_settings(max_batch=1, intra_op_threads=args.threads, thread_spinning=args.spin,
                             speculative=args.speculative, prefix_cache=False)
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
              "threads": args.threads or os.cpu_count(), "spinning": args.spin, "og_spinning": True,
              "speculative": args.speculative,
              "huge_page_mb": engine.model.runner.huge_page_bytes >> 20, "og_loaded_first": args.og_first}
    result.update(asyncio.run(run()))
    result["loadavg_at_end"] = os.getloadavg()
    emit(result)
    if not result["same_greedy_tokens"]:
        raise SystemExit("engine and bare loop disagree on greedy tokens")


if __name__ == "__main__":
    main()
