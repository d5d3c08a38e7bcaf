"""Prompt-lookup speculation (docs/speculative.md): ortserve with it on and off, against llama.cpp on
the same GGUF, over three workloads, single stream and N streams, in one run (prints JSON).

Workloads (chat, greedy): a RAG answer that quotes its passage, a JSON edit (return the object with
one field changed), free text. For each: decode tok/s (first token excluded), acceptance (accepted
guesses / proposed), whether greedy text is identical on and off, and ratios: on/off, on/llama-bench
tg128, on/llama-server default and on/llama-server `--spec-type ngram-simple` (same prompts through
its /v1/chat/completions, its own `timings.predicted_per_second`).

    .venv/bin/python benchmarks/speculative.py --llama-bin ~/.cache/ortserve-test/llama.cpp/build/bin
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from _common import machine, median, model_dir

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.models.catalog import embedded_gguf
from ortserve.types import SamplingParams

PASSAGE = ("The Aurora X2 kettle is covered by a limited warranty for two years from the date of purchase. "
           "The warranty covers defects in materials and workmanship under normal household use. It does not "
           "cover damage caused by limescale, dropping the kettle, or using it with a power supply other than "
           "the one stated on the rating label. To make a claim, contact support with your receipt, the serial "
           "number printed under the base, and a short description of the fault.")
RECORD = {"id": 4812, "name": "Ada Lovelace", "email": "ada@example.org", "city": "London",
          "roles": ["admin", "editor"], "active": True, "plan": "team", "seats": 12}
WORKLOADS = {
    "rag_quote": [{"role": "system", "content": f"Answer from this passage, quoting it word for word.\n\n{PASSAGE}"},
                  {"role": "user", "content": "What does the warranty say? Quote the passage exactly."}],
    "json_edit": [{"role": "user", "content": "Return this JSON object unchanged except that city is Paris. "
                                              f"Reply with the JSON only.\n{json.dumps(RECORD)}"}],
    "free_text": [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a map."}],
}


async def ortserve_one(engine: AsyncEngine, messages: list[dict[str, str]], gen: int) -> dict[str, Any]:
    params = SamplingParams(temperature=0, max_tokens=gen)
    out = await engine.generate(messages=messages, params=params)
    return {"tps": out.metrics.output_tokens_per_second, "tokens": out.metrics.output_tokens, "text": out.text,
            "spec": out.metrics.speculative}


async def ortserve_many(engine: AsyncEngine, messages: list[dict[str, str]], n: int, gen: int) -> float:
    """Aggregate output tok/s of ``n`` concurrent copies (each asks for a different variant)."""
    params = SamplingParams(temperature=0, max_tokens=gen)
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(messages=messages[:-1] + [
        {"role": "user", "content": f"{messages[-1]['content']} (#{i})"}], params=params) for i in range(n)))
    return sum(o.metrics.output_tokens for o in outs) / (time.perf_counter() - t0)


class LlamaServer:
    def __init__(self, bin_dir: Path, gguf: Path, threads: int, parallel: int, extra: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
        cmd = [str(bin_dir / "llama-server"), "-m", str(gguf), "-t", str(threads), "--host", "127.0.0.1",
               "--port", str(self.port), "-np", str(parallel), "-c", str(2048 * parallel), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server did not start: {' '.join(cmd)}")

    def one(self, messages: list[dict[str, str]], gen: int) -> dict[str, Any]:
        r = httpx.post(f"{self.url}/v1/chat/completions", json={"messages": messages, "max_tokens": gen,
                                                                 "temperature": 0}, timeout=600).json()
        t = r["timings"]
        return {"tps": t["predicted_per_second"], "tokens": t["predicted_n"],
                "accepted": t.get("draft_n_accepted"), "proposed": t.get("draft_n")}

    def many(self, messages: list[dict[str, str]], n: int, gen: int) -> float:
        async def run() -> float:
            async with httpx.AsyncClient(timeout=600) as c:
                t0 = time.perf_counter()
                rs = await asyncio.gather(*(c.post(f"{self.url}/v1/chat/completions", json={
                    "messages": messages[:-1] + [{"role": "user", "content": f"{messages[-1]['content']} (#{i})"}],
                    "max_tokens": gen, "temperature": 0}) for i in range(n)))
                return sum(r.json()["timings"]["predicted_n"] for r in rs) / (time.perf_counter() - t0)
        return asyncio.run(run())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def step_costs(engine: AsyncEngine, reps: int = 7) -> dict[int, float]:
    """Median ms of one step of one sequence (512 tokens held) feeding 1 (a decode step) to 9
    tokens (a verify step with k = width - 1): what a guess costs."""
    runner = engine.model.runner
    runner.prefill(0, list(range(100, 612)))
    out = {}
    for width in (1, 2, 3, 5, 9):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            runner.verify([list(range(700, 700 + width))])
            times.append(time.perf_counter() - t0)
        out[width] = round(1000 * median(times), 2)
    runner.clear(0)
    return out


def tg128(bin_dir: Path, gguf: Path, threads: int) -> float:
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", "0",
                          "-n", "128", "-r", "1", "-o", "jsonl"], capture_output=True, text=True, env=env,
                         timeout=900, check=True).stdout
    return float(next(json.loads(line) for line in out.splitlines() if line.startswith("{"))["avg_ts"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN"))
    ap.add_argument("--model", default=None, help="ortserve model (default: the default model)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--stream-gen", type=int, default=32, help="tokens per request in the N-stream runs")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of the workloads")
    args = ap.parse_args()
    chosen = {name: WORKLOADS[name] for name in args.workloads.split(",")}
    path, mid = model_dir(args.model)
    gguf = embedded_gguf()
    res: dict[str, Any] = {"benchmark": "speculative", "model": mid, "gguf": str(gguf), "machine": machine(),
                           "threads": args.threads, "gen": args.gen, "reps": args.reps, "streams": args.streams}
    engine = AsyncEngine.load(path, load_settings(max_batch=args.streams, intra_op_threads=args.threads))
    res["step_ms_by_width"] = step_costs(engine)  # before the loop starts: the runner is ours
    engine.core.start()
    rows: dict[str, dict[str, Any]] = {}
    try:
        for name, msgs in chosen.items():
            row: dict[str, Any] = {}
            runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
            many: dict[str, list[float]] = {"on": [], "off": []}
            for _ in range(args.reps):  # on and off interleaved: a busy machine drifts between runs
                for key in ("off", "on"):
                    engine.core.speculative = key == "on"
                    runs[key].append(asyncio.run(ortserve_one(engine, msgs, args.gen)))
                    many[key].append(asyncio.run(ortserve_many(engine, msgs, args.streams, args.stream_gen)))
            for key in ("off", "on"):
                row[f"ortserve_{key}_tps"] = median([r["tps"] for r in runs[key]])
                row[f"ortserve_{key}_{args.streams}x_tps"] = median(many[key])
            spec = runs["on"][-1]["spec"] or {}
            row["acceptance"], row["proposed"], row["tokens"] = spec.get("acceptance"), spec.get("proposed"), \
                runs["on"][-1]["tokens"]
            row["greedy_identical"] = runs["on"][-1]["text"] == runs["off"][-1]["text"]
            row["on_over_off"] = row["ortserve_on_tps"] / row["ortserve_off_tps"]
            row[f"on_over_off_{args.streams}x"] = (row[f"ortserve_on_{args.streams}x_tps"]
                                                   / row[f"ortserve_off_{args.streams}x_tps"])
            rows[name] = row
    finally:
        engine.core.speculative = True
        engine.core.stop()
    res["workloads"] = rows
    bin_dir = Path(args.llama_bin).expanduser() if args.llama_bin else None
    if bin_dir is None or not (bin_dir / "llama-bench").is_file():
        res["llamacpp"] = {"skipped": "no llama-bench (pass --llama-bin)"}
    else:
        tg = tg128(bin_dir, gguf, args.threads)
        res["llamacpp_tg128"] = tg
        for name, row in rows.items():
            row["on_over_tg128"] = row["ortserve_on_tps"] / tg
        if (bin_dir / "llama-server").is_file():
            for label, extra in (("default", []), ("ngram_simple", ["--spec-type", "ngram-simple"])):
                srv = LlamaServer(bin_dir, gguf, args.threads, args.streams, extra)
                try:
                    for name, msgs in chosen.items():
                        runs = [srv.one(msgs, args.gen) for _ in range(args.reps)]
                        row = rows[name]
                        row[f"llama_server_{label}_tps"] = median([r["tps"] for r in runs])
                        if runs[-1]["proposed"]:
                            row[f"llama_server_{label}_acceptance"] = runs[-1]["accepted"] / runs[-1]["proposed"]
                        row[f"llama_server_{label}_{args.streams}x_tps"] = srv.many(msgs, args.streams,
                                                                                    args.stream_gen)
                        row[f"on_over_llama_server_{label}"] = row["ortserve_on_tps"] / row[f"llama_server_{label}_tps"]
                finally:
                    srv.close()
        else:
            res["llama_server"] = {"skipped": f"no llama-server in {bin_dir}: llama-bench tg128 only"}
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
