r"""A long prompt among running streams: chunked prefill keeps their pace (JSON, one run).

    flock /work/bench.lock nice -n -10 .venv/bin/python benchmarks/long_prompt.py [--model ID] \\
        [--streams 8] [--prompt 4096] [--chunks 128,256,512] [--ratios 1,2,3] [--rss-prompt 8000]

For each configuration (a fixed token chunk with the time budget off, or the time budget
``prefill_ratio`` r with chunks capped at 512): 8 streams decode; their inter-token times
(TPOT) are taken before a 4k-token prompt arrives and while it is prefilled (arrival -> its
first token). The long prompt's TTFT is compared with its TTFT on the idle engine under the
same configuration, measured in the same round (idle, the time budget does not apply: there
is nobody to protect, so the prompt goes in whole chunks).
Goal (issue 18): p99 TPOT during <= 3x before, long-prompt TTFT <= 1.5x idle.
Peak RSS for one 8k prompt runs in child processes: "before" = whole prefill with logits
for every position (the graph as built), "after" = 512-token chunks, last-position logits.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import QUESTIONS, emit, figure, machine, model_dir, pct, save_figure

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.types import SamplingParams


def long_text(engine: AsyncEngine, tokens: int) -> str:
    base = " ".join(QUESTIONS) + " "
    ids = engine.codec.encode(base * (tokens // 100 + 2), add_special_tokens=False)[:tokens - 2]
    return engine.codec.decode(ids)


async def ttft(engine: AsyncEngine, prompt: str) -> float:
    t0 = time.perf_counter()
    async for ev in engine.submit(prompt=prompt, params=SamplingParams(temperature=0, max_tokens=1)):
        if ev.finished:
            return time.perf_counter() - t0
    raise RuntimeError("no final event")


async def round_for(engine: AsyncEngine, prompt: str, streams: int, warm_tokens: int) -> dict[str, Any]:
    """Streams decoding, then the long prompt arrives; gaps before vs during its prefill."""
    times: list[list[float]] = [[] for _ in range(streams)]
    chunks: list[int] = []  # the long prompt's chunk sizes (the only prefill while it runs)
    runner = engine.core.runner
    orig_prefill = runner.prefill

    def spy(row: int, ids: list[int], **kw: Any) -> Any:
        if len(ids) > 100 or kw.get("start"):
            chunks.append(len(ids))
        return orig_prefill(row, ids, **kw)
    params = SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)
    handles = [engine.submit(messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], params=params)
               for i in range(streams)]

    async def consume(i: int) -> None:
        async for ev in handles[i]:
            if ev.token_ids:
                times[i].extend([time.perf_counter()] * len(ev.token_ids))
            if ev.finished:
                return

    tasks = [asyncio.ensure_future(consume(i)) for i in range(streams)]
    while min(len(t) for t in times) < warm_tokens:
        await asyncio.sleep(0.01)
    arrival = time.perf_counter()
    runner.prefill = spy
    try:
        long_ttft = await ttft(engine, prompt)
    finally:
        del runner.prefill
    first = arrival + long_ttft
    await asyncio.sleep(0.2)
    for h in handles:
        await engine.abort(h.id)
    await asyncio.gather(*tasks)
    # "before" starts once every stream has its first token: earlier gaps include the other
    # streams' own prefills, which are not the steady decode pace the goal compares against
    steady = max(ts[0] for ts in times)
    before, during = [], []
    for ts in times:
        for a, b in itertools.pairwise(ts):
            if b <= arrival and a >= max(arrival - 10, steady):
                before.append(b - a)
            elif a >= arrival and (b <= first or a < first <= b):  # up to the gap the last chunk ends
                during.append(b - a)
    return {"ttft_during_s": long_ttft, "before": before, "during": during, "chunks": chunks}


async def tradeoff(engine: AsyncEngine, prompt: str, configs: list[tuple[int, float]],
                   streams: int) -> list[dict[str, Any]]:
    rows = []
    await ttft(engine, prompt)  # warm the session's shapes
    for c, ratio in configs:
        engine.core.chunk_tokens, engine.core.prefill_ratio = c, ratio
        idle = await ttft(engine, prompt)
        r = await round_for(engine, prompt, streams, warm_tokens=48)
        b50, b99 = pct(r["before"], 0.5), pct(r["before"], 0.99)
        d50, d99 = pct(r["during"], 0.5), pct(r["during"], 0.99)
        rows.append({"chunk": c, "prefill_ratio": ratio, "loadavg_1m": round(os.getloadavg()[0], 1),
                     "chunks_during": len(r["chunks"]),
                     "chunk_tokens_median": pct(r["chunks"], 0.5),
                     "tpot_before_ms": {"p50": round(1e3 * b50, 1), "p99": round(1e3 * b99, 1)},
                     "tpot_during_ms": {"p50": round(1e3 * d50, 1), "p99": round(1e3 * d99, 1)},
                     "p99_during_over_before": round(d99 / b99, 2) if b99 else None,
                     "tokens_during": len(r["during"]),
                     "long_ttft_idle_s": round(idle, 2), "long_ttft_during_s": round(r["ttft_during_s"], 2),
                     "ttft_during_over_idle": round(r["ttft_during_s"] / idle, 2)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def rss_child(args: argparse.Namespace) -> None:
    """One 8k prompt in a fresh process: RSS after load, and peak."""
    path, _ = model_dir(args.model)
    settings = load_settings(max_batch=1, prefill_chunk=args.child_chunk, last_logits_only=not args.full_logits)
    engine = AsyncEngine.load(path, settings)
    engine.core.start()
    import psutil

    loaded = psutil.Process().memory_info().rss
    prompt = long_text(engine, args.rss_prompt)
    n = engine.count_tokens(prompt)
    t0 = time.perf_counter()
    asyncio.run(engine.generate(prompt=prompt, params=SamplingParams(temperature=0, max_tokens=1)))
    wall = time.perf_counter() - t0
    engine.core.stop()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(json.dumps({"prompt_tokens": n, "rss_after_load_mb": round(loaded / 2**20),
                      "peak_rss_mb": round(peak / 2**20), "prefill_growth_mb": round((peak - loaded) / 2**20),
                      "prefill_s": round(wall, 2)}))


def peak_rss(args: argparse.Namespace, chunk: int, full_logits: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--rss-child", "--child-chunk", str(chunk), "--rss-prompt", str(args.rss_prompt)]
    cmd += ["--model", args.model] if args.model else []
    cmd += ["--full-logits"] if full_logits else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ}).stdout
    return json.loads(out.strip().splitlines()[-1])


def plot(result: dict[str, Any], path: Path) -> None:
    """The trade-off as a picture: each configuration's stream slowdown against the long prompt's."""
    from matplotlib.patches import Rectangle

    fig, ax = figure((7, 4.5))
    ax.add_patch(Rectangle((0.9, 0.9), 1.5 - 0.9, 3 - 0.9, color="tab:green", alpha=0.15,
                           label="goal: streams <= 3x, TTFT <= 1.5x"))
    # with zero cost per model call: TPOT x = 1 + c/T_d and TTFT x = 1 + T_d/c, so x_ttft = 1 + 1/(x_tpot - 1)
    xs = [1.02 + i * 0.01 for i in range(400)]
    ax.plot(xs, [1 + 1 / (x - 1) for x in xs], color="grey", linestyle="--", linewidth=1,
            label="best any chunking can do with zero cost per call")
    for i, row in enumerate(result["chunks"]):
        x = row["ttft_during_over_idle"]
        y = row["tpot_during_ms"]["p50"] / row["tpot_before_ms"]["p50"]
        budget = row["prefill_ratio"] > 0
        name = f"prefill_ratio {row['prefill_ratio']:g}" if budget else f"fixed {row['chunk']}-token chunks"
        ax.scatter([x], [y], color="tab:blue" if budget else "tab:orange", s=40, zorder=3)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, 4 if i % 2 else -11), fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(0.9, 1.3 * max(r["tpot_during_ms"]["p50"] / r["tpot_before_ms"]["p50"] for r in result["chunks"]))
    ax.set_xlim(0.9, max(3.0, max(r["ttft_during_over_idle"] for r in result["chunks"]) + 0.3))
    ax.set_xlabel("long prompt's TTFT, during / idle")
    ax.set_ylabel("streams' p50 TPOT, during / before (log)")
    when = result["machine"]["time"]
    ax.set_title(f"A {result['long_prompt_tokens']}-token prompt among {result['streams']} decoding streams "
                 f"({result['model']}, {when})", fontsize=9)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=4096, help="long prompt tokens")
    ap.add_argument("--chunks", default="128,256,512", help="fixed token chunks (time budget off)")
    ap.add_argument("--ratios", default="1,2,3", help="prefill_ratio values (chunks capped at 512)")
    ap.add_argument("--rss-prompt", type=int, default=8000)
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--plot", type=Path, default=None, help="also draw the trade-off to this PNG")
    ap.add_argument("--replot", type=Path, default=None, metavar="JSON",
                    help="only draw --plot from an earlier run's JSON (no benchmark)")
    ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-chunk", type=int, default=512, help=argparse.SUPPRESS)
    ap.add_argument("--full-logits", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args)
        return
    if args.replot:
        if args.plot is None:
            ap.error("--replot needs --plot PNG")
        plot(json.loads(args.replot.read_text(encoding="utf-8")), args.plot)
        return
    result: dict[str, Any] = {"benchmark": "long_prompt", "machine": machine()}
    if not args.skip_rss:
        result["peak_rss_8k"] = {"before (whole prefill, all-position logits)": peak_rss(args, 8192, True),
                                 "after (512-token chunks, last-position logits)": peak_rss(args, 512, False)}
        print(json.dumps(result["peak_rss_8k"]), file=sys.stderr)
    path, model_id = model_dir(args.model)
    engine = AsyncEngine.load(path, load_settings(max_batch=16))
    engine.core.start()
    prompt = long_text(engine, args.prompt)
    result.update(model=model_id, streams=args.streams, long_prompt_tokens=engine.count_tokens(prompt))
    configs = [(int(c), 0.0) for c in args.chunks.split(",") if c]
    configs += [(512, float(r)) for r in args.ratios.split(",") if r]
    result["chunks"] = asyncio.run(tradeoff(engine, prompt, configs, args.streams))
    engine.core.stop()
    result["loadavg_at_end"] = os.getloadavg()
    if args.plot:
        plot(result, args.plot)
    emit(result)


if __name__ == "__main__":
    main()
