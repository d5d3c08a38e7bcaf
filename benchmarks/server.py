"""Server overhead: streaming /v1/chat/completions against the in-process engine, one run (JSON).

    .venv/bin/python benchmarks/server.py [--model ID_OR_DIR] [--gen 128] [--reps 3]

Targets (issue 4): streaming single-request decode tok/s >= 0.90 x the engine's own figure;
16 concurrent streaming clients finish with 0 errors and aggregate tok/s >= 0.90 x the
engine's 16-request figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
from _common import QUESTIONS, emit, machine, median, model_dir

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.loopback import wait_healthy
from ortserve.types import SamplingParams


async def stream_one(client: httpx.AsyncClient, url: str, question: str, gen: int) -> dict:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": gen, "min_tokens": gen,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            return {"error": resp.status_code}
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"error": chunk["error"]["message"]}
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content") and first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    return {"tokens": tokens, "ttft": (first or end) - t0, "decode_tps": (tokens - 1) / (end - (first or end))
            if first and tokens > 1 else 0.0, "wall": end - t0}


async def measure(path, url: str, gen: int, reps: int, clients: int) -> tuple[dict, dict]:
    """The in-process engine and the server alternate rep by rep (same load for both)."""
    engine = AsyncEngine.load(path, load_settings(max_batch=16))
    await engine.start()
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    msgs = [[{"role": "user", "content": q}] for q in QUESTIONS[:clients]]
    e_single, e_agg, s_single, s_agg, errors = [], [], [], [], 0
    async with httpx.AsyncClient(timeout=600) as client:
        await engine.generate(messages=msgs[0], params=params)
        await stream_one(client, url, QUESTIONS[0], gen)
        for i in range(reps):
            e_single.append((await engine.generate(messages=msgs[i], params=params)).metrics.output_tokens_per_second)
            s_single.append((await stream_one(client, url, QUESTIONS[i], gen))["decode_tps"])
            t0 = time.perf_counter()
            outs = await asyncio.gather(*(engine.generate(messages=m, params=params) for m in msgs))
            e_agg.append(sum(o.metrics.output_tokens for o in outs) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            souts = await asyncio.gather(*(stream_one(client, url, q, gen) for q in QUESTIONS[:clients]))
            s_agg.append(sum(o.get("tokens", 0) for o in souts) / (time.perf_counter() - t0))
            errors += sum(1 for o in souts if "error" in o)
    await engine.stop()
    return ({"single_decode_tps": median(e_single), "concurrent_tps": median(e_agg)},
            {"single_decode_tps": median(s_single), "concurrent_tps": median(s_agg), "errors": errors})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--port", type=int, default=8093)
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    proc = subprocess.Popen([sys.executable, "-m", "ortserve.cli.main", "serve", "--model", str(path),
                             "--port", str(args.port), "--log-level", "warning"], env=os.environ.copy())
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_healthy(url, 120, poll=0.1)  # 600 polls of 0.1 s and up to 1 s each, before
        eng, srv = asyncio.run(measure(path, url, args.gen, args.reps, 16))
    finally:
        proc.terminate()
        proc.wait(30)
    ratios = {"stream_single_vs_engine": srv["single_decode_tps"] / eng["single_decode_tps"],
              "stream_16_vs_engine": srv["concurrent_tps"] / eng["concurrent_tps"]}
    emit({"benchmark": "server", "model": mid, "machine": machine(), "gen_tokens": args.gen, "engine": eng,
          "server": srv, "ratios": ratios,
          "targets_met": {"single>=0.90": ratios["stream_single_vs_engine"] >= 0.90,
                          "concurrent>=0.90": ratios["stream_16_vs_engine"] >= 0.90,
                          "zero_errors": srv["errors"] == 0}})


if __name__ == "__main__":
    main()
