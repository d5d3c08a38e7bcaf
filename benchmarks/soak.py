r"""Soak: N streaming clients for T minutes against a real `ortserve serve`, with random
disconnects and periodic bursts of abrupt disconnects; the server's RSS every 10 s, plotted.

    nice -n 19 .venv/bin/python benchmarks/soak.py --streams 16 --minutes 30 --burst 100 \\
        --burst-every 300 --plot docs/img/soak_rss.png --out docs/soak.json

Targets (issue 18): after the first 2 minutes RSS drift < 5%; 0 errors; 0 requests left
running after each burst (the engine's running + waiting is back to the clients still in flight).

Drift is reported two ways: from the single sample at the end of the warm-up (the old figure),
and from the peak of the first window after it (minutes 2-4) to the peak of everything after.
The second is the one that tells a leak: when the engine goes idle it gives memory back, and a
sample taken in such a dip would count the climb back to the same plateau as drift.

The clients keep pooled connections at most 2 s (uvicorn closes idle ones after 5 s): a
client starved for longer than that could send on a connection the server is closing, and
get a reset (an ``httpx.ReadError`` before any response) that says nothing about the server.
Each error is recorded with its time and whether a response had started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from _common import QUESTIONS, emit, machine, model_dir, plot_rss

from ortserve.loopback import wait_healthy


class Soak:
    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url = url
        self.args = args
        self.stop_at = 0.0
        self.inflight = 0          # steady-stream requests the soak has open
        self.completed = 0
        self.disconnects = 0
        self.errors: list[str] = []
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()

    def body(self, stream: bool) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}], "stream": stream,
                "max_tokens": self.rng.randint(16, self.args.max_tokens), "temperature": 0.7}

    async def stream_loop(self, client: httpx.AsyncClient) -> None:
        while time.monotonic() < self.stop_at:
            hang_up = self.rng.random() < self.args.disconnect_rate
            self.inflight += 1
            started = False
            try:
                async with client.stream("POST", f"{self.url}/v1/chat/completions", json=self.body(True)) as r:
                    started = True
                    if r.status_code != 200:
                        self.errors.append(f"status {r.status_code}: {(await r.aread())[:200]!r}")
                        continue
                    chunks = 0
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            chunks += 1
                            if '"error"' in line:
                                self.errors.append(line[:200])
                            if hang_up and chunks >= 3:
                                self.disconnects += 1
                                break
                    else:
                        self.completed += 1
            except httpx.HTTPError as exc:
                self.errors.append(f"t={time.monotonic() - self.t0:.0f}s {type(exc).__name__}: {exc!r} "
                                   f"({'mid-response' if started else 'before any response'})")
            finally:
                self.inflight -= 1

    async def burst(self, n: int) -> None:
        """n clients that hang up abruptly: half after the first streamed chunk, half while waiting
        for a non-streamed answer."""
        # one client for the burst: 100 clients would build 100 SSL contexts and stall this
        # event loop (and so the steady streams) for seconds; an unfinished response closes its
        # connection either way, which is the abrupt disconnect the server sees
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as c:
            async def one(i: int) -> None:
                if i % 2 == 0:
                    async with c.stream("POST", f"{self.url}/v1/chat/completions", json=self.body(True)) as r:
                        async for line in r.aiter_lines():
                            if line.startswith("data: "):
                                return
                else:
                    try:
                        await c.post(f"{self.url}/v1/chat/completions", json=self.body(False),
                                     timeout=self.rng.uniform(0.2, 2.0))
                    except httpx.TimeoutException:
                        pass
            await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        self.disconnects += n

    async def leftover(self, client: httpx.AsyncClient, wait: float = 60.0) -> tuple[int, float]:
        """Requests the engine still holds beyond the steady clients in flight, polled until it
        is 0 or ``wait`` seconds pass; and the seconds it took."""
        best, t0 = 10**9, time.monotonic()
        while time.monotonic() - t0 < wait:
            await asyncio.sleep(0.5)
            h = (await client.get(f"{self.url}/healthz")).json()
            best = min(best, max(0, h.get("running", 0) + h.get("waiting", 0) - self.inflight))
            if best == 0:
                break
        return best, round(time.monotonic() - t0, 1)


async def run(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    soak = Soak(url, args)
    proc = psutil.Process(pid)
    t0 = time.monotonic()
    soak.stop_at = t0 + args.minutes * 60
    samples: list[tuple[float, float]] = []
    bursts: list[dict[str, Any]] = []

    async def sampler() -> None:
        while time.monotonic() < soak.stop_at + 15:
            samples.append((time.monotonic() - t0, proc.memory_info().rss / 2**20))
            await asyncio.sleep(args.sample_every)

    async def burster(client: httpx.AsyncClient) -> None:
        n = 1
        while time.monotonic() + args.burst_every < soak.stop_at + 1:
            await asyncio.sleep(t0 + n * args.burst_every - time.monotonic())
            b0 = time.monotonic() - t0
            rss_before = proc.memory_info().rss / 2**20
            await soak.burst(args.burst)
            left, settle = await soak.leftover(client)
            bursts.append({"t_s": round(b0), "rss_before_mb": round(rss_before, 1),
                           "rss_after_mb": round(proc.memory_info().rss / 2**20, 1), "left_running": left,
                           "settled_in_s": settle})
            n += 1

    limits = httpx.Limits(max_connections=args.streams + 8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        tasks = [asyncio.ensure_future(sampler())]
        if args.burst:
            tasks.append(asyncio.ensure_future(burster(client)))
        await asyncio.gather(*(soak.stream_loop(client) for _ in range(args.streams)))
        await asyncio.gather(*tasks)
        final_left, _ = await soak.leftover(client)
    warm = [m for t, m in samples if t >= args.warmup]
    base = warm[0] if warm else 0.0
    first = [m for t, m in samples if args.warmup <= t < args.warmup + 120]
    rest = [m for t, m in samples if t >= args.warmup + 120]
    peak0 = max(first) if first else 0.0
    return {
        "streams": args.streams, "minutes": args.minutes, "burst": args.burst, "burst_every_s": args.burst_every,
        "completed": soak.completed, "disconnects": soak.disconnects, "errors": len(soak.errors),
        "error_samples": soak.errors[:5], "bursts": bursts, "left_running_at_end": final_left,
        "rss_mb": {"start": round(samples[0][1], 1), "after_warmup": round(base, 1),
                   "max_after_warmup": round(max(warm), 1) if warm else None,
                   "end": round(samples[-1][1], 1)},
        "drift_after_warmup_pct": round(100 * (max(warm) - base) / base, 2) if warm else None,
        "peak_minutes_2_4_mb": round(peak0, 1), "peak_after_mb": round(max(rest), 1) if rest else None,
        "peak_drift_pct": round(100 * (max(rest) - peak0) / peak0, 2) if rest and peak0 else None,
        "end_vs_warmup_pct": round(100 * (warm[-1] - base) / base, 2) if warm else None,
        "samples": [(round(t), round(m, 1)) for t, m in samples],
    }


def plot(result: dict[str, Any], path: Path) -> None:
    plot_rss(path, result["samples"], result.get("warmup_s", 120),
             f"{result['streams']} streams, bursts of {result['burst']} disconnects (dashed); "
             f"peak drift after warm-up {result['peak_drift_pct']}%", marks=[b["t_s"] for b in result["bursts"]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--burst", type=int, default=100, help="abrupt disconnects per burst (0: none)")
    ap.add_argument("--burst-every", type=float, default=300, help="seconds between bursts")
    ap.add_argument("--disconnect-rate", type=float, default=0.05, help="share of steady streams cut early")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--sample-every", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=120, help="seconds before drift is measured")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    path, model_id = model_dir(args.model)
    env = {**os.environ, "ORTSERVE_MAX_QUEUE": str(4 * args.burst + 64), "ORTSERVE_LOG_LEVEL": "warning"}
    server = subprocess.Popen([sys.executable, "-m", "ortserve.cli.main", "serve", "--model", str(path),
                               "--port", str(args.port)], env=env)
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_healthy(url, 180, poll=0.5)
        result = {"benchmark": "soak", "model": model_id, "machine": machine(), "warmup_s": args.warmup,
                  **asyncio.run(run(url, server.pid, args))}
        cpu = psutil.Process(server.pid).cpu_times()
        result["server_cpu_s"] = round(cpu.user + cpu.system)
    finally:
        server.terminate()
        server.wait(30)
    result["loadavg_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    if args.plot:
        plot(result, args.plot)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    emit({k: v for k, v in result.items() if k != "samples"})


if __name__ == "__main__":
    main()
