"""Text streams while images are encoded, in one vision model's batch (issue 42's target: the text
streams' median inter-token gap while 4 image requests run <= 2x the gap with the server idle).

Starts `ortserve serve` on ``ORTSERVE_HOME`` (which must hold the vision model ``--model``, e.g. the
random Qwen2.5-VL that benchmarks/vision_vs_llamaserver.py imports under its ``--work`` folder), then
streams ``--streams`` text-only chat completions to the vision model at once (its rows), alone and
then while ``--images`` clients each send image requests in a loop, every image new bytes (so every
one runs the vision encoder and its prefill). Greedy, ``min_tokens`` so every stream is the same
length. Prints JSON: the median and p90 gap per phase, their ratio, how many image requests
finished during the measured phase, the load.

    ORTSERVE_HOME=/tmp/vlbench/home PYTHONPATH=src .venv/bin/python benchmarks/vision_beside_text.py \
        --model vl-mid [--streams 4] [--images 4] [--size 448] [--max-tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
from _common import emit, machine, median, pct, story_body, stream_gaps

from ortserve.loopback import wait_healthy


def png(seed: int, size: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def text_phase(url: str, model: str, streams: int, max_tokens: int, base: int) -> list[float]:
    gaps: list[list[float]] = [[] for _ in range(streams)]
    threads = [threading.Thread(target=stream_gaps, args=(url, story_body(model, base + i, max_tokens), gaps[i]))
               for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [g for gs in gaps for g in gs]


def image_loop(url: str, model: str, size: int, seed: int, stop: threading.Event, done: list[float]) -> None:
    n = 0
    while not stop.is_set():
        body = {"model": model, "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": png(seed * 100_000 + n, size)}}]}]}
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900).raise_for_status()
        done.append(time.perf_counter())
        n += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="the vision model's id in ORTSERVE_HOME's store")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--size", type=int, default=448, help="image side in pixels")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=8793)
    args = ap.parse_args()

    env = {**os.environ, "ORTSERVE_LOG_LEVEL": "warning"}
    server = subprocess.Popen([sys.executable, "-m", "ortserve.cli.main", "serve", "--port", str(args.port),
                               "--intra-op-threads", str(args.threads)], env=env)
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_healthy(url, 600, poll=0.5)
        warm: list[float] = []
        httpx.post(f"{url}/v1/chat/completions", timeout=900, json={"model": args.model, "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                         {"type": "image_url", "image_url": {"url": png(999, args.size)}}]}]}
                   ).raise_for_status()                                    # loads the model, warms the encoder
        stream_gaps(url, story_body(args.model, 99, 8), warm)
        idle = text_phase(url, args.model, args.streams, args.max_tokens, 0)
        stop, done = threading.Event(), []
        workers = [threading.Thread(target=image_loop, args=(url, args.model, args.size, s + 1, stop, done))
                   for s in range(args.images)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        time.sleep(1.0)                                                    # the image requests are in flight
        busy = text_phase(url, args.model, args.streams, args.max_tokens, 100)
        end = time.perf_counter()
        stop.set()
        for w in workers:
            w.join()
    finally:
        server.terminate()
        server.wait(60)
    ms = 1000.0
    emit({"benchmark": "vision_beside_text", "model": args.model, "machine": machine(),
          "streams": args.streams, "image_clients": args.images, "image_side": args.size,
          "images_finished_while_measured": sum(1 for t in done if start <= t <= end),
          "idle_gap_ms": {"median": round(median(idle) * ms, 2), "p90": round(pct(idle, 0.9) * ms, 2), "n": len(idle)},
          "busy_gap_ms": {"median": round(median(busy) * ms, 2), "p90": round(pct(busy, 0.9) * ms, 2), "n": len(busy)},
          "median_ratio": round(median(busy) / median(idle), 3) if idle else None,
          "loadavg_at_end": os.getloadavg()})


if __name__ == "__main__":
    main()
