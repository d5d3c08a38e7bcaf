"""ortserve's server over HTTP: `ortserve serve` in a subprocess, streaming /v1/completions clients.

TTFT is the first streamed chunk with text as the client sees it, so it includes HTTP, JSON
and SSE framing on top of the engine; peak RSS counts the server process, not the client.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from ortserve.bench.backends.base import Backend, Spec
from ortserve.bench.backends.onnx import onnx_quality
from ortserve.bench.measure import Timing, now
from ortserve.bench.workload import Prompt
from ortserve.loopback import free_port


class ServerBackend(Backend):
    batches = True

    def __init__(self, spec: Spec, ready_timeout: float = 300.0) -> None:
        super().__init__(spec)
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "ortserve.cli.main", "serve", "--model", spec.model_dir,
               "--host", "127.0.0.1", "--port", str(self.port), "--max-batch", str(max(spec.max_batch, 1)),
               "--max-queue", "1024", "--no-telemetry", "--log-level", "warning"]
        if spec.threads:
            cmd += ["--intra-op-threads", str(spec.threads)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, encoding="utf-8", errors="replace")
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ortserve serve exited with {self.proc.returncode}: "
                                   f"{(self.proc.stderr.read() if self.proc.stderr else '')[-2000:]}")
            try:
                r = httpx.get(f"{self.url}/healthz", timeout=2)
                if r.status_code == 200:
                    break
                if r.json().get("status") == "error":
                    raise RuntimeError(f"the server failed to load the model: {r.json().get('error')}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the server was not ready after {ready_timeout:.0f} s")
            time.sleep(0.2)
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(600.0))

    def run(self, prompts: list[Prompt], gen_tokens: int) -> list[Timing]:
        return self.loop.run_until_complete(self._batch(prompts, gen_tokens))

    async def _batch(self, prompts: list[Prompt], gen_tokens: int) -> list[Timing]:
        t0 = now()
        return list(await asyncio.gather(*(self._one(p, gen_tokens, t0) for p in prompts)))

    async def _one(self, prompt: Prompt, gen_tokens: int, t0: float) -> Timing:
        body = {"prompt": prompt.text, "max_tokens": gen_tokens, "min_tokens": gen_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        first: float | None = None
        usage: dict[str, Any] = {}
        async with self.client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"/v1/completions answered {resp.status_code}: {(await resp.aread())[:500]!r}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"server error: {chunk['error']}")
                if first is None and any(c.get("text") for c in chunk.get("choices", [])):
                    first = now() - t0
                usage = chunk.get("usage") or usage
        end = now() - t0
        return Timing(first if first is not None else end, end, int(usage.get("completion_tokens", 0)),
                      int(usage.get("prompt_tokens", 0)))

    def quality(self) -> dict[str, Any]:
        return onnx_quality(self.spec.model_dir)

    def info(self) -> dict[str, Any]:
        import onnxruntime_genai as og  # type: ignore[import-untyped]

        return {"runtime": f"ortserve serve (uvicorn) on onnxruntime-genai {og.__version__}",
                "model": self.spec.model_dir, "url": self.url}

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def close(self) -> None:
        if getattr(self, "loop", None) is not None:
            self.loop.run_until_complete(self.client.aclose())
            self.loop.close()
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: the server drains (nothing in flight) and exits
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
