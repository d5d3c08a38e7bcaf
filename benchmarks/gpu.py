"""The GPU measurement of issue 17, in one run (prints JSON). Runs on any provider; on CPU it is a
smoke test of the same code.

    .venv/bin/python benchmarks/gpu.py --model smollm2-135m:fp16-cuda --device cuda \
        [--hf-dir DIR] [--gen 128] [--reps 3] [--contexts 256,2048,8000]

Targets, each a ratio to a reference measured in the same run:
  single-stream decode tok/s, engine       >= 0.95 x raw og.Generator on the same variant
  16 concurrent, aggregate tok/s, engine   >= 1.2 x og.Engine on the same 16 prompts
Also: og's static batch of 16, decode tok/s against context length with the KV cache on the
device and on the host (the cost the device-resident runner removes), and transformers fp16 on
the same GPU as a reference column (when --hf-dir is given and torch sees a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _common import QUESTIONS, RawOg, emit, machine, median, model_dir

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.types import SamplingParams


def og_engine_burst(raw: RawOg, prompts: list[list[int]], gen: int) -> float:
    """Aggregate tok/s of onnxruntime-genai's own continuous-batching og.Engine."""
    import numpy as np

    og = raw.og
    engine = og.Engine(raw.model)
    buf = engine.create_event_buffer(4096)
    t0 = time.perf_counter()
    for ids in prompts:
        req = engine.create_request()
        opts = og.TurnOptions(req)
        opts.set_max_generated_tokens(gen)
        opts.set_min_generated_tokens(gen)
        opts.set_temperature(0)
        req.begin_turn(np.asarray(ids, dtype=np.int32), opts)
    tokens = 0
    while engine.has_pending_requests():
        for ev in engine.run(buf) or []:
            tokens += ev.flags == og.EngineEventFlags.TOKEN
    return tokens / (time.perf_counter() - t0)


def filler_prompt(engine: AsyncEngine, tokens: int) -> str:
    """Text of about ``tokens`` tokens (the held-out text, repeated)."""
    from importlib import resources

    text = resources.files("ortserve").joinpath("data", "heldout.txt").read_text(encoding="utf-8")
    ids = engine.codec.encode(text, add_special_tokens=False)
    ids = (ids * (tokens // len(ids) + 1))[:tokens]
    return engine.codec.decode(ids)


async def decode_tps(engine: AsyncEngine, prompt: str, gen: int) -> float:
    out = await engine.generate(prompt=prompt, params=SamplingParams(temperature=0, max_tokens=gen,
                                                                     ignore_eos=True))
    return float(out.metrics.output_tokens_per_second)


def transformers_fp16(hf_dir: str, prompt_ids: list[int], gen: int, reps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    if not torch.cuda.is_available():
        return {"skipped": "torch sees no CUDA device"}
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float16).to("cuda").eval()
    ids = torch.tensor([prompt_ids], device="cuda")
    runs = []
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=8, do_sample=False)  # warm-up
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=gen, min_new_tokens=gen, do_sample=False)
            torch.cuda.synchronize()
            runs.append((out.shape[1] - ids.shape[1]) / (time.perf_counter() - t0))
    return {"decode_tps": median(runs), "runtime": f"torch {torch.__version__}, fp16, {torch.cuda.get_device_name()}"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hf-dir", default=None, help="Hugging Face copy of the model, for the transformers column")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--contexts", default="256,2048,8000")
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    contexts = [int(c) for c in args.contexts.split(",") if c]
    result: dict[str, Any] = {"benchmark": "gpu", "model": mid, "model_dir": str(path), "device": args.device,
                              "machine": machine(), "gen_tokens": args.gen}
    raw = RawOg(path)
    prompts = [raw.chat_ids(q) for q in QUESTIONS[: args.clients]]
    msgs = [[{"role": "user", "content": q}] for q in QUESTIONS[: args.clients]]
    settings = {"device": args.device, "max_batch": max(16, args.clients)}
    engine = AsyncEngine.load(path, load_settings(**settings, kv_placement="auto"), mid)
    host = AsyncEngine.load(path, load_settings(**settings, kv_placement="host"), mid)
    result["kv_placement"] = {"engine": type(engine.core.runner.kv).__name__,
                              "host_reference": type(host.core.runner.kv).__name__,
                              "kv_dtype": str(engine.core.runner.dtype.__name__)}
    params = SamplingParams(temperature=0, max_tokens=args.gen, ignore_eos=True)

    async def run_all() -> dict[str, Any]:
        await engine.start()
        await host.start()
        await engine.generate(messages=msgs[0], params=params)  # warm-up
        raw.single(prompts[0], args.gen)
        singles, raw_single, raw_batch, bursts, og_engine = [], [], [], [], []
        for i in range(args.reps):  # the two sides alternate rep by rep
            raw_single.append(raw.single(prompts[i % len(prompts)], args.gen)["decode_tps"])
            out = await engine.generate(messages=msgs[i % len(msgs)], params=params)
            singles.append(out.metrics.output_tokens_per_second)
            raw_batch.append(raw.batch(prompts, args.gen)["end_to_end_tps"])
            og_engine.append(og_engine_burst(raw, prompts, args.gen))
            t0 = time.perf_counter()
            outs = await asyncio.gather(*(engine.generate(messages=m, params=params) for m in msgs))
            bursts.append(sum(o.metrics.output_tokens for o in outs) / (time.perf_counter() - t0))
        by_context = []
        for n in contexts:
            if n + args.gen > engine.context_length:
                by_context.append({"context": n, "skipped": f"over the context length {engine.context_length}"})
                continue
            prompt = filler_prompt(engine, n)
            dev, hst = [], []
            for _ in range(max(1, args.reps - 1)):
                dev.append(await decode_tps(engine, prompt, args.gen))
                hst.append(await decode_tps(host, prompt, args.gen))
            by_context.append({"context": n, "device_kv_decode_tps": median(dev), "host_kv_decode_tps": median(hst),
                               "device_vs_host": median(dev) / median(hst)})
        await engine.stop()
        await host.stop()
        return {"engine_single_decode_tps": median(singles), "raw_og_single_decode_tps": median(raw_single),
                "engine_concurrent_tps": median(bursts), "og_static_batch_tps": median(raw_batch),
                "og_engine_concurrent_tps": median(og_engine), "by_context": by_context}

    r = asyncio.run(run_all())
    result.update(r)
    result["ratios"] = {"single_vs_raw_og": r["engine_single_decode_tps"] / r["raw_og_single_decode_tps"],
                        "concurrent_vs_og_engine": r["engine_concurrent_tps"] / r["og_engine_concurrent_tps"],
                        "concurrent_vs_og_static_batch": r["engine_concurrent_tps"] / r["og_static_batch_tps"]}
    result["targets_met"] = {"single>=0.95": result["ratios"]["single_vs_raw_og"] >= 0.95,
                             "concurrent>=1.2x_og_engine": result["ratios"]["concurrent_vs_og_engine"] >= 1.2}
    if args.hf_dir:
        result["transformers_fp16"] = transformers_fp16(args.hf_dir, prompts[0], args.gen, args.reps)
    emit(result)


if __name__ == "__main__":
    main()
