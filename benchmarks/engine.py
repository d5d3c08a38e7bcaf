"""Engine throughput and latency against raw onnxruntime-genai, in one run (prints JSON).

    .venv/bin/python benchmarks/engine.py [--model ID_OR_DIR] [--gen 128] [--reps 3]

Targets (issue 3), each a ratio to a reference measured in the same run:
  single-stream decode tok/s        >= 0.95 x raw og.Generator
  16 concurrent, aggregate tok/s    >= 0.85 x raw og.Generator, same 16 prompts as one static batch
  TTFT p50 with 16 concurrent       <= 4 x single-stream TTFT
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _common import QUESTIONS, RawOg, emit, machine, median, model_dir, pct

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.types import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    result = {"benchmark": "engine", "model": mid, "model_dir": str(path), "machine": machine(),
              "gen_tokens": args.gen}
    raw = RawOg(path)
    prompts = [raw.chat_ids(q) for q in QUESTIONS[: args.clients]]
    engine = AsyncEngine.load(path, load_settings(max_batch=max(16, args.clients)))
    params = SamplingParams(temperature=0, max_tokens=args.gen, ignore_eos=True)
    msgs = [[{"role": "user", "content": q}] for q in QUESTIONS[: args.clients]]

    async def run_all() -> tuple[dict, list[dict], list[dict]]:
        """Engine and raw og.Generator alternate rep by rep, so a change in machine load
        between phases does not tilt the ratios."""
        await engine.start()
        await engine.generate(messages=msgs[0], params=params)  # warm-up
        raw.single(prompts[0], args.gen)
        singles, raw_single, raw_batch, bursts, ttfts_burst, ttfts_steady = [], [], [], [], [], []
        for i in range(args.reps):
            raw_single.append(raw.single(prompts[i % len(prompts)], args.gen))
            singles.append(await engine.generate(messages=msgs[i % len(msgs)], params=params))
            raw_batch.append(raw.batch(prompts, args.gen))
            t0 = time.perf_counter()
            outs = await asyncio.gather(*(engine.generate(messages=m, params=params) for m in msgs))
            wall = time.perf_counter() - t0
            bursts.append(sum(o.metrics.output_tokens for o in outs) / wall)
            ttfts_burst += [o.metrics.ttft for o in outs]

        # steady state: each client sends its next request as soon as its last one ends,
        # so new requests arrive while the others decode
        async def client(i: int, n: int) -> list[float]:
            out = []
            for k in range(n):
                r = await engine.generate(messages=msgs[(i + k) % len(msgs)],
                                          params=SamplingParams(temperature=0, max_tokens=args.gen // 2 + 8 * i,
                                                                ignore_eos=True))
                out.append(r.metrics.ttft)
            return out[1:]  # the first request of each client belongs to the opening burst
        for xs in await asyncio.gather(*(client(i, 4) for i in range(len(msgs)))):
            ttfts_steady += xs
        await engine.stop()
        eng = {"single_decode_tps": median([o.metrics.output_tokens_per_second for o in singles]),
               "single_ttft": median([o.metrics.ttft for o in singles]),
               "concurrent_tps": median(bursts),
               "ttft_burst_p50": median(ttfts_burst), "ttft_burst_p90": pct(ttfts_burst, 0.9),
               "ttft_steady_p50": median(ttfts_steady), "ttft_steady_p90": pct(ttfts_steady, 0.9)}
        return eng, raw_single, raw_batch

    eng, raw_single, raw_batch = asyncio.run(run_all())
    raw_tps = median([r["decode_tps"] for r in raw_single])
    raw_batch_tps = median([r["end_to_end_tps"] for r in raw_batch])
    result["raw_og"] = {"single_decode_tps": raw_tps, "single_ttft": median([r["ttft"] for r in raw_single]),
                        "static_batch_end_to_end_tps": raw_batch_tps,
                        "static_batch_decode_tps": median([r["decode_tps"] for r in raw_batch])}
    result["engine"] = eng
    result["ratios"] = {
        "single_decode_vs_raw": eng["single_decode_tps"] / raw_tps,
        "concurrent_vs_raw_static_batch": eng["concurrent_tps"] / raw_batch_tps,
        "ttft_steady_p50_vs_single": eng["ttft_steady_p50"] / eng["single_ttft"],
        "ttft_burst_p50_vs_single": eng["ttft_burst_p50"] / eng["single_ttft"],
    }
    r = result["ratios"]
    result["targets_met"] = {"single_decode>=0.95": r["single_decode_vs_raw"] >= 0.95,
                             "concurrent>=0.85": r["concurrent_vs_raw_static_batch"] >= 0.85,
                             "ttft_p50<=4x": r["ttft_steady_p50_vs_single"] <= 4}
    emit(result)


if __name__ == "__main__":
    main()
