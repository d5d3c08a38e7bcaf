"""Chat streams while transcriptions run: the median gap between streamed chat tokens with 2
transcriptions in flight, over the same gap with the server idle (issue 43's target: <= 1.5x).

Starts `ortserve serve` (the default chat model, Whisper-base for audio, audio_concurrency 2), streams
chat completions alone, then again while two clients transcribe the shipped phrases spoken by espeak-ng
in a loop. Prints JSON.

    PYTHONPATH=src .venv/bin/python benchmarks/audio_beside_chat.py [--audio-threads 1] [--streams 4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _common import emit, machine, median, model_dir, pct, story_body, stream_gaps

from ortserve.loopback import wait_healthy


def chat_gaps(url: str, streams: int, max_tokens: int) -> list[float]:
    """Gaps between streamed chunks over ``streams`` sequential greedy chat streams."""
    gaps: list[float] = []
    for i in range(streams):
        stream_gaps(url, story_body("default", i, max_tokens), gaps, timeout=300)
    return gaps


def transcribe_loop(url: str, wav: bytes, stop: threading.Event, done: list[float]) -> None:
    while not stop.is_set():
        r = httpx.post(f"{url}/v1/audio/transcriptions", files={"file": ("p.wav", wav)},
                       data={"model": "whisper-1"}, timeout=600)
        r.raise_for_status()
        done.append(time.perf_counter())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--audio-threads", type=int, default=1)
    ap.add_argument("--port", type=int, default=8767)
    args = ap.parse_args()
    from ortserve.audio import speech

    path, model_id = model_dir(args.model)
    wav = speech.synthesize(" ".join(speech.phrases()), Path(tempfile.mkdtemp()) / "p.wav").read_bytes()
    env = {**os.environ, "ORTSERVE_AUDIO_CONCURRENCY": "2", "ORTSERVE_AUDIO_THREADS": str(args.audio_threads),
           "ORTSERVE_LOG_LEVEL": "warning"}
    server = subprocess.Popen([sys.executable, "-m", "ortserve.cli.main", "serve", "--model", str(path),
                               "--port", str(args.port)], env=env)
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_healthy(url, 300, poll=0.5)
        httpx.post(f"{url}/v1/audio/transcriptions", files={"file": ("p.wav", wav)}, timeout=900).raise_for_status()
        chat_gaps(url, 1, 8)                                  # warm-up
        idle = chat_gaps(url, args.streams, args.max_tokens)
        stop, done = threading.Event(), []
        workers = [threading.Thread(target=transcribe_loop, args=(url, wav, stop, done)) for _ in range(2)]
        for w in workers:
            w.start()
        time.sleep(3.0)                                       # both transcriptions are decoding
        busy = chat_gaps(url, args.streams, args.max_tokens)
        stop.set()
        for w in workers:
            w.join()
    finally:
        server.terminate()
        server.wait(30)
    ms = 1000.0
    emit({"benchmark": "audio_beside_chat", "model": model_id, "machine": machine(),
          "audio_threads": args.audio_threads, "transcriptions_finished": len(done),
          "idle_gap_ms": {"median": round(median(idle) * ms, 2), "p90": round(pct(idle, 0.9) * ms, 2)},
          "busy_gap_ms": {"median": round(median(busy) * ms, 2), "p90": round(pct(busy, 0.9) * ms, 2)},
          "median_ratio": round(median(busy) / median(idle), 3) if idle else None,
          "loadavg_at_end": os.getloadavg()})


if __name__ == "__main__":
    main()
