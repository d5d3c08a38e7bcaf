"""Ray Serve overhead and scaling on this machine (prints JSON).

    .venv/bin/python benchmarks/ray.py [--model ID_OR_DIR] [--gen 32] [--requests 32] [--reps 2]

Two comparisons, each a ratio of figures measured in the same run, sides alternating rep by rep:

- ``proxy_vs_direct``: one replica behind Ray's HTTP proxy vs the same server run directly
  (`ortserve serve`), both with 1 ONNX Runtime thread and 4 concurrent clients. Target: the
  proxy costs little (ratio near 1.0).
- ``two_vs_one``: 2 replicas vs 1 replica (each 1 thread, 1 CPU reserved) at 16 concurrent
  clients, redeploying between reps. On N free cores the ceiling is min(2, N); with 2 cores
  shared with other work, the figure is what the cores left over allow.

Every request asks for exactly ``gen`` tokens (min_tokens = max_tokens); tok/s = completion
tokens of all requests / wall time of the batch.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from _common import QUESTIONS, emit, machine, median, model_dir

from ortserve.loopback import free_port, wait_healthy

# This file is ray.py: drop its directory from the path so that `import ray` finds Ray.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

SETTINGS = {"intra_op_threads": 1, "max_batch": 16}


async def batch(url: str, requests: int, concurrency: int, gen: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    replicas: Counter[str] = Counter()
    tokens = failed = 0

    async def one(i: int, client: httpx.AsyncClient) -> None:
        nonlocal tokens, failed
        async with sem:
            r = await client.post(f"{url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                "max_tokens": gen, "min_tokens": gen, "temperature": 0})
        if r.status_code != 200:
            failed += 1
            return
        tokens += r.json()["usage"]["completion_tokens"]
        replicas[r.headers.get("x-ortserve-replica", "direct")] += 1

    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, client) for i in range(requests)))
        wall = time.perf_counter() - t0
    return {"tok_s": round(tokens / wall, 2), "wall_s": round(wall, 2), "tokens": tokens, "failed": failed,
            "by_replica": dict(replicas)}


def start_direct(path: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "ortserve.cli.main", "serve", "--model", str(path), "--port", str(port),
           "--intra-op-threads", "1", "--max-batch", "16", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if wait_healthy(f"http://127.0.0.1:{port}", 300, poll=0.5):
        return proc
    proc.kill()
    raise RuntimeError("the direct server did not start")


def deploy(path: Path, replicas: int) -> float:
    from ray import serve

    from ortserve.deploy import ray as ray_deploy

    t0 = time.monotonic()
    serve.run(ray_deploy.build(str(path), SETTINGS, replicas=replicas, num_cpus=1.0), name="ortserve",
              route_prefix="/")
    return round(time.monotonic() - t0, 1)




def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="store id or directory (default: the default model)")
    ap.add_argument("--gen", type=int, default=32, help="tokens per request")
    ap.add_argument("--requests", type=int, default=32, help="requests per measurement")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    from ortserve.deploy import ray as ray_deploy

    path, model_id = model_dir(args.model)
    out: dict[str, Any] = {"benchmark": "ray", "model": model_id, "gen": args.gen, "requests": args.requests,
                           "machine": machine(), "settings": SETTINGS}
    direct_port, proxy_port = free_port(), free_port()
    direct = start_direct(path, direct_port)
    try:
        t0 = time.monotonic()
        proxy = ray_deploy.run(str(path), SETTINGS, port=proxy_port, cluster_cpus=os.cpu_count() or 2, replicas=1,
                               num_cpus=1.0)
        out["ray_start_s"] = round(time.monotonic() - t0, 1)
        urls = {"direct": f"http://127.0.0.1:{direct_port}", "proxy": proxy}
        asyncio.run(batch(urls["direct"], 4, 4, 4))  # warm both
        asyncio.run(batch(urls["proxy"], 4, 4, 4))
        a: dict[str, list[dict[str, Any]]] = {"direct": [], "proxy": []}
        for rep in range(args.reps):
            for side in (("direct", "proxy") if rep % 2 == 0 else ("proxy", "direct")):
                a[side].append(asyncio.run(batch(urls[side], args.requests // 2, 4, args.gen)))
        direct.terminate()
        direct.wait(30)
        b: dict[str, list[dict[str, Any]]] = {"1": [], "2": []}
        redeploys = []
        for rep in range(args.reps):
            for n in ((1, 2) if rep % 2 == 0 else (2, 1)):
                if not (rep == 0 and n == 1):
                    redeploys.append(deploy(path, n))
                asyncio.run(batch(proxy, 4, 4, 4))
                b[str(n)].append(asyncio.run(batch(proxy, args.requests, 16, args.gen)))
        out["proxy_vs_direct"] = {
            "concurrency": 4, "direct_tok_s": [r["tok_s"] for r in a["direct"]],
            "proxy_tok_s": [r["tok_s"] for r in a["proxy"]],
            "ratio": round(median([r["tok_s"] for r in a["proxy"]]) / median([r["tok_s"] for r in a["direct"]]), 3)}
        out["two_vs_one"] = {
            "concurrency": 16, "one_replica_tok_s": [r["tok_s"] for r in b["1"]],
            "two_replicas_tok_s": [r["tok_s"] for r in b["2"]],
            "two_replicas_by_replica": [r["by_replica"] for r in b["2"]],
            "ratio": round(median([r["tok_s"] for r in b["2"]]) / median([r["tok_s"] for r in b["1"]]), 3),
            "redeploy_s": redeploys}
        out["failed"] = sum(r["failed"] for rs in (*a.values(), *b.values()) for r in rs)
        out["loadavg_at_end"] = os.getloadavg()
    finally:
        if direct.poll() is None:
            direct.kill()
        ray_deploy.shutdown()
    emit(out)


if __name__ == "__main__":
    main()
