"""LoRA serving cost (docs/lora.md); prints JSON.

    .venv/bin/python benchmarks/lora.py [--model smollm2-135m] [--rank 16] [--tokens 64] [--streams 16]
        [--adapters 4] [--reps 3] [--modes mask gather]

Adapters are random numpy A/B of the right shapes on every attention and MLP projection
(rank 16, scale folded in), built from the base graph's own shapes: the cost of the LoRA term
does not depend on the values. Measured in one run, all greedy with ignore_eos:

* single stream: decode tokens/s of the base engine (no LoRA edit) against the LoRA engine
  with the adapter, and against the LoRA engine running the base (index 0, the zero adapter);
* 16 streams: total tokens/s of 16 concurrent requests on the base engine against 16 over
  4 adapters (4 each, one mixed batch) on the LoRA engine;

each for both ways of computing a mixed batch (``lora_mode`` mask and gather, engine/lora.py);
the three engines are loaded together and their runs interleaved (base, mask, gather, base, ...),
every figure the best of ``--reps``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, machine, model_dir

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.engine.graph import load_decoder
from ortserve.engine.lora import Adapter, find_targets
from ortserve.engine.runner import ModelSpec
from ortserve.types import SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def random_adapters(path: Path, n: int, rank: int) -> list[Adapter]:
    spec = ModelSpec.read(path)
    graph = load_decoder(spec.onnx_path).graph
    targets = find_targets(graph, q_width=spec.heads * spec.head_size, kv_width=spec.kv_heads * spec.head_size)
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        weights = {}
        for t in targets:
            for module, width in t.parts:
                a = rng.standard_normal((t.inputs, rank), dtype=np.float32) / np.sqrt(t.inputs)
                b = rng.standard_normal((rank, width), dtype=np.float32) * 0.01
                weights[f"layers.{t.layer}.{module}"] = (a, b)
        out.append(Adapter(name=f"bench-{i}", weights=weights))
    return out


def write_peft(adapter: Adapter, out: Path, rank: int) -> Path:
    """``adapter`` as a PEFT directory (adapter_config.json + adapter_model.safetensors, PEFT's key
    names and [r, in] / [out, r] layouts, lora_alpha = r so the scale is 1), for
    ``ortserve models import-adapter``: no torch needed."""
    import json

    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors, modules = {}, set()
    for key, (a, b) in adapter.weights.items():
        _, layer, module = key.split(".")
        block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        stem = f"base_model.model.model.layers.{layer}.{block}.{module}"
        tensors[f"{stem}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"{stem}.lora_B.weight"] = np.ascontiguousarray(b.T)
        modules.add(module)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": sorted(modules),
        "bias": "none", "task_type": "CAUSAL_LM"}), encoding="utf-8")
    return out


async def streams(engine: AsyncEngine, adapters: list[str], tokens: int) -> dict[str, float]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = await asyncio.gather(*[engine.generate(prompt=PROMPT, params=params, adapter=a) for a in adapters])
    wall = time.perf_counter() - t0
    n = sum(o.metrics.output_tokens for o in outs)
    decode = float(np.median([o.metrics.output_tokens_per_second for o in outs]))
    return {"streams": len(adapters), "tokens": n, "wall_s": round(wall, 3), "total_tps": round(n / wall, 2),
            "decode_tps_per_stream": round(decode, 2)}


async def measure(plan: list[tuple[str, AsyncEngine, list[tuple[str, list[str]]]]], tokens: int,
                  reps: int) -> dict[str, dict[str, Any]]:
    """Every engine's runs ``reps`` times, interleaved across the engines (base, mask, gather, base,
    ...), so that a shared machine's load falls on all of them; the best of each (load only ever
    slows a run down)."""
    for _, engine, runs in plan:
        await engine.start()
        await streams(engine, [runs[0][1][0]], 8)  # warm-up
    try:
        best: dict[str, dict[str, Any]] = {name: {} for name, _, _ in plan}
        for _ in range(reps):
            for name, engine, runs in plan:
                for run, adapters in runs:
                    r = await streams(engine, adapters, tokens)
                    if run not in best[name] or r["total_tps"] > best[name][run]["total_tps"]:
                        best[name][run] = r
        return best
    finally:
        for _, engine, _ in plan:
            await engine.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["mask", "gather"], choices=["mask", "gather"],
                    help="the LoRA engines to load beside the base (a 1B model: --modes mask saves memory and time)")
    args = ap.parse_args()
    path, model_id = model_dir(args.model)
    settings = load_settings(prefix_cache=False, max_batch=args.streams)
    adapters = random_adapters(path, args.adapters, args.rank)
    names = [a.name for a in adapters]
    many = [names[i % len(names)] for i in range(args.streams)]
    lora_runs = [("single_adapter", [names[0]]), ("single_base_row", [""]), ("streams_adapters", many)]
    plan = [("base", AsyncEngine.load(path, settings), [("single", [""]), ("streams", [""] * args.streams)])]
    plan += [(mode, AsyncEngine.load(path, settings.model_copy(update={"lora_mode": mode}), adapters=adapters), lora_runs)
             for mode in args.modes]
    measured = asyncio.run(measure(plan, args.tokens, args.reps))
    base = measured["base"]
    single = base["single"]["decode_tps_per_stream"]
    result: dict[str, Any] = {"machine": machine(), "model": model_id, "rank": args.rank, "adapters": args.adapters,
                              "reps": args.reps, "best_of_reps": True, "interleaved": True,
                              "targets": "q,k,v,o,gate,up,down (every layer)", "tokens_per_request": args.tokens,
                              "base": base}
    for mode in args.modes:
        lora = measured[mode]
        result[mode] = lora | {
            "single_stream_overhead": round(single / lora["single_adapter"]["decode_tps_per_stream"] - 1, 4),
            "single_stream_base_row_overhead": round(
                single / lora["single_base_row"]["decode_tps_per_stream"] - 1, 4),
            "streams_throughput_ratio": round(lora["streams_adapters"]["total_tps"] / base["streams"]["total_tps"], 4)}
    emit(result)


if __name__ == "__main__":
    main()
