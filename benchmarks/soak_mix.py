r"""Mixed soak: every kind of client at once against a real `ortserve serve` for a fixed time, the
server's RSS sampled throughout (issue 45: one hour, 0 errors, RSS drift < 5%).

    nice -n 10 .venv/bin/python benchmarks/soak_mix.py --minutes 60 --out docs/soak_mix.json \
        --plot docs/img/soak_mix_rss.png

The clients, each a loop until the time is up (``--scale`` multiplies the counts):

- agent loops: a conversation that grows turn by turn (the prefix cache reuses the earlier turns),
  streamed, restarted after 6 turns; prompt-lookup speculation is on by default in the server;
- plain chat, not streamed; and streams cancelled after their third chunk (an abrupt disconnect);
- tool calls: ``tool_choice: "required"`` with two tools, then the tool's result sent back;
- embeddings: 1-8 texts per request;
- files and vector stores: upload a file, create a store with it, wait for ingestion, search it
  (hybrid), then delete the store and the file (churn: nothing may accumulate);
- Responses with ``store: true``: create, read back, delete;
- LoRA rows: streamed chats that name a random rank-8 adapter of the base (``--lora``, on by
  default: imported into the throw-away home at start), so adapter rows share the batch with the
  base rows above.

Every response is counted by route and status. An error is any 5xx, any 4xx (every request is
valid), an error event in a stream, a transport error, or a reply that does not hold what it
should. RSS (``/proc``/psutil of the server process) every ``--sample-every`` seconds; drift is
from the first sample after ``--warmup`` to the end, and from the peak of the first 10 minutes
after the warm-up to the peak of everything after (a dip while idle does not count as drift).
The server runs in a throw-away ``ORTSERVE_HOME`` (the embedding models copied in) with a fixed
KV budget (``--kv-cache-mb``, default 512): the prefix cache keeps finished conversations' KV
inside that budget, so under the auto budget (half the free memory, several GB here) RSS grows
for as long as there is room, by design, and a drift figure would measure the cache filling.
The prefix cache's bytes are sampled with RSS (from ``/metrics``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
from _common import QUESTIONS, emit, machine, model_dir, plot_rss

from ortserve.loopback import wait_healthy

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "integer"}, "b": {"type": "integer"}},
                                          "required": ["a", "b"]}}},
]
LORA_ID = "soak-lora"
WORDS = ["river", "stone", "lantern", "copper", "orchard", "violet", "harbor", "meadow", "falcon", "cedar", "ember", "glacier", "thistle", "quartz", "willow", "saffron", "canyon", "beacon", "marble", "juniper"]


class Mix:
    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url, self.args = url, args
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.stop_at = self.t0 + args.minutes * 60
        self.status: Counter[str] = Counter()      # "route status" -> count
        self.done: Counter[str] = Counter()        # client kind -> completed units of work
        self.errors: list[str] = []

    def alive(self) -> bool:
        return time.monotonic() < self.stop_at

    def err(self, kind: str, what: str) -> None:
        self.errors.append(f"t={time.monotonic() - self.t0:.0f}s {kind}: {what[:300]}")

    async def call(self, c: httpx.AsyncClient, kind: str, method: str, path: str, **kw: Any) -> httpx.Response | None:
        try:
            r = await c.request(method, self.url + path, **kw)
        except httpx.HTTPError as exc:
            self.err(kind, f"{method} {path} {type(exc).__name__}: {exc!r}")
            return None
        route = path.split("?", maxsplit=1)[0]
        for prefix in ("/v1/files/", "/v1/vector_stores/", "/v1/responses/"):
            if route.startswith(prefix):
                route = prefix + "{id}" + ("/search" if route.endswith("/search") else "")
        self.status[f"{method} {route} {r.status_code}"] += 1
        if r.status_code >= 400:
            self.err(kind, f"{method} {path} {r.status_code} {r.text}")
            return None
        return r

    async def stream(self, c: httpx.AsyncClient, kind: str, body: dict[str, Any], cut_after: int = 0) -> str | None:
        """A streamed chat; the text, or None on an error; ``cut_after`` > 0 hangs up after that many chunks."""
        text, chunks = [], 0
        try:
            async with c.stream("POST", f"{self.url}/v1/chat/completions", json={**body, "stream": True}) as r:
                self.status[f"POST /v1/chat/completions(stream) {r.status_code}"] += 1
                if r.status_code != 200:
                    self.err(kind, f"stream {r.status_code} {(await r.aread())[:200]!r}")
                    return None
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.err(kind, f"error event {line}")
                        return None
                    for ch in event.get("choices", []):
                        text.append(ch.get("delta", {}).get("content") or "")
                    chunks += 1
                    if cut_after and chunks >= cut_after:
                        return "".join(text)
        except httpx.HTTPError as exc:
            self.err(kind, f"stream {type(exc).__name__}: {exc!r}")
            return None
        return "".join(text)

    def tokens(self) -> int:
        return self.rng.randint(8, self.args.max_tokens)

    async def agent(self, c: httpx.AsyncClient) -> None:
        while self.alive():
            messages = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."}]
            for _ in range(6):
                if not self.alive():
                    return
                messages.append({"role": "user", "content": self.rng.choice(QUESTIONS)})
                text = await self.stream(c, "agent", {"messages": messages, "max_tokens": self.tokens(),
                                                      "temperature": 0.7})
                if text is None:
                    break
                messages.append({"role": "assistant", "content": text})
                self.done["agent_turns"] += 1

    async def chat(self, c: httpx.AsyncClient) -> None:
        while self.alive():
            body = {"messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}],
                    "max_tokens": self.tokens(), "temperature": 0.7}
            r = await self.call(c, "chat", "POST", "/v1/chat/completions", json=body)
            if r is not None:
                if r.json()["choices"][0]["message"].get("content") is None:
                    self.err("chat", f"no content: {r.text[:200]}")
                self.done["chat"] += 1

    async def cancel(self, c: httpx.AsyncClient) -> None:
        while self.alive():
            body = {"messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}], "max_tokens": 200}
            if await self.stream(c, "cancel", body, cut_after=3) is not None:
                self.done["cancelled_streams"] += 1
            await asyncio.sleep(self.rng.uniform(0, 1))

    async def tools(self, c: httpx.AsyncClient) -> None:
        while self.alive():
            messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris, and 2+3?"}]
            r = await self.call(c, "tools", "POST", "/v1/chat/completions",
                                json={"messages": messages, "tools": TOOLS, "tool_choice": "required",
                                      "max_tokens": 64})
            if r is None:
                continue
            msg = r.json()["choices"][0]["message"]
            calls = msg.get("tool_calls") or []
            if not calls:
                self.err("tools", f"required tool choice gave no call: {r.text[:200]}")
                continue
            messages.append(msg)
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": '{"result": "sunny, 21 C"}'})
            if await self.call(c, "tools", "POST", "/v1/chat/completions",
                               json={"messages": messages, "tools": TOOLS, "max_tokens": 24}) is not None:
                self.done["tool_loops"] += 1

    async def embed(self, c: httpx.AsyncClient) -> None:
        while self.alive():
            texts = [" ".join(self.rng.choices(WORDS, k=self.rng.randint(3, 40))) for _ in range(self.rng.randint(1, 8))]
            r = await self.call(c, "embed", "POST", "/v1/embeddings", json={"input": texts})
            if r is not None:
                if len(r.json()["data"]) != len(texts):
                    self.err("embed", "wrong number of vectors")
                self.done["embeddings"] += 1

    async def rag(self, c: httpx.AsyncClient) -> None:
        while self.alive():
            marker = f"zq{self.rng.randrange(10**9)}"
            body = "\n\n".join(" ".join(self.rng.choices(WORDS, k=60)) for _ in range(6)) + f"\n\nThe code word is {marker}."
            r = await self.call(c, "rag", "POST", "/v1/files", files={"file": (f"{marker}.txt", body.encode())},
                                data={"purpose": "assistants"})
            if r is None:
                continue
            file_id = r.json()["id"]
            vs = await self.call(c, "rag", "POST", "/v1/vector_stores", json={"name": marker, "file_ids": [file_id]})
            if vs is not None:
                vs_id = vs.json()["id"]
                for _ in range(600):
                    s = await self.call(c, "rag", "GET", f"/v1/vector_stores/{vs_id}")
                    if s is None or s.json()["file_counts"]["in_progress"] == 0:
                        break
                    await asyncio.sleep(0.5)
                hit = await self.call(c, "rag", "POST", f"/v1/vector_stores/{vs_id}/search",
                                      json={"query": f"code word {marker}", "max_num_results": 3})
                if hit is not None:
                    if not any(marker in part.get("text", "") for d in hit.json()["data"] for part in d["content"]):
                        self.err("rag", f"search did not find {marker}")
                    else:
                        self.done["rag_cycles"] += 1
                await self.call(c, "rag", "DELETE", f"/v1/vector_stores/{vs_id}")
            await self.call(c, "rag", "DELETE", f"/v1/files/{file_id}")

    async def lora(self, c: httpx.AsyncClient) -> None:
        while self.alive():
            body = {"model": LORA_ID, "messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}],
                    "max_tokens": self.tokens(), "temperature": 0.7}
            if await self.stream(c, "lora", body) is not None:
                self.done["lora_turns"] += 1

    async def responses(self, c: httpx.AsyncClient) -> None:
        while self.alive():
            r = await self.call(c, "responses", "POST", "/v1/responses",
                                json={"input": self.rng.choice(QUESTIONS), "max_output_tokens": self.tokens(),
                                      "store": True})
            if r is None:
                continue
            rid = r.json()["id"]
            got = await self.call(c, "responses", "GET", f"/v1/responses/{rid}")
            if got is not None and got.json()["id"] != rid:
                self.err("responses", "read back another id")
            if await self.call(c, "responses", "DELETE", f"/v1/responses/{rid}") is not None:
                self.done["responses"] += 1


def mem_split(pid: int) -> tuple[float, float, float]:
    """The server's anonymous and file-backed resident MB (``smaps_rollup``) and the main ``[heap]``
    mapping's resident MB (``smaps``): growth in anonymous memory outside ``[heap]`` is mapped
    blocks (numpy's large arrays, ONNX Runtime's arena), in ``[heap]`` glibc's small allocations."""
    anon = file = heap = 0.0
    try:
        with Path(f"/proc/{pid}/smaps_rollup").open(encoding="ascii") as f:
            for line in f:
                if line.startswith("Anonymous:"):
                    anon = int(line.split()[1]) / 1024
                elif line.startswith("Rss:"):
                    file = int(line.split()[1]) / 1024
        with Path(f"/proc/{pid}/smaps").open(encoding="utf-8", errors="replace") as f:
            inside = False
            for line in f:
                if not line[0].isupper() or "-" in line.split()[0]:
                    inside = line.rstrip().endswith("[heap]")
                elif inside and line.startswith("Rss:"):
                    heap += int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return -1.0, -1.0, -1.0
    return anon, file - anon, heap


async def run(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    mix = Mix(url, args)
    proc = psutil.Process(pid)
    samples: list[tuple[float, float]] = []

    cache: list[float] = []            # the prefix cache's KV bytes (MB) at each sample, from /metrics
    split: list[tuple[float, float, float]] = []   # (anonymous, file-backed, [heap]) MB at each sample

    async def sampler(c: httpx.AsyncClient) -> None:
        while mix.alive():
            samples.append((time.monotonic() - mix.t0, proc.memory_info().rss / 2**20))
            split.append(mem_split(pid))
            try:
                text = (await c.get(f"{url}/metrics")).text
                cache.append(next(float(line.split()[1]) for line in text.splitlines()
                                  if line.startswith("ortserve_prefix_cache_bytes ")) / 2**20)
            except (httpx.HTTPError, StopIteration):
                cache.append(-1.0)
            await asyncio.sleep(args.sample_every)

    n = args.scale
    plan = {mix.agent: 3 * n, mix.chat: n, mix.cancel: n, mix.tools: n, mix.embed: n, mix.rag: n, mix.responses: n,
            mix.lora: n if args.lora else 0}
    limits = httpx.Limits(max_connections=64, keepalive_expiry=2.0)   # see soak.py: idle closes at 5 s
    async with httpx.AsyncClient(timeout=args.request_timeout, limits=limits) as c:
        await asyncio.gather(sampler(c), *(fn(c) for fn, k in plan.items() for _ in range(k)))
        await asyncio.sleep(5)
        h = (await c.get(f"{url}/healthz")).json()
    samples.append((time.monotonic() - mix.t0, proc.memory_info().rss / 2**20))
    warm = [(t, m) for t, m in samples if t >= args.warmup]
    base, end = warm[0][1], warm[-1][1]
    first = [m for t, m in warm if t < args.warmup + 600]
    rest = [m for t, m in warm if t >= args.warmup + 600]
    by_status: Counter[str] = Counter()
    for key, v in mix.status.items():
        by_status[key.rsplit(" ", 1)[1]] += v
    return {
        "minutes": args.minutes, "scale": n, "kv_cache_mb": args.kv_cache_mb, "max_tokens": args.max_tokens,
        "warmup_s": args.warmup,
        "requests": sum(mix.status.values()), "by_status": dict(sorted(by_status.items())),
        "by_route": dict(sorted(mix.status.items())), "work_done": dict(mix.done),
        "errors": len(mix.errors), "error_samples": mix.errors[:20],
        "left_running_at_end": h.get("running", 0) + h.get("waiting", 0),
        "rss_mb": {"start": round(samples[0][1], 1), "after_warmup": round(base, 1), "end": round(end, 1),
                   "max_after_warmup": round(max(m for _, m in warm), 1)},
        "drift_pct": round(100 * (end - base) / base, 2),
        "peak_first_10_min_after_warmup_mb": round(max(first), 1) if first else None,
        "peak_after_mb": round(max(rest), 1) if rest else None,
        "peak_drift_pct": round(100 * (max(rest) - max(first)) / max(first), 2) if rest and first else None,
        "prefix_cache_mb_at_warmup_and_end": [round(cache[len(samples) - len(warm)], 1), round(cache[-1], 1)],
        "samples": [(round(t), round(m, 1)) for t, m in samples],
        "prefix_cache_mb": [round(m, 1) for m in cache],
        "anon_file_heap_mb": [tuple(round(x, 1) for x in row) for row in split],
    }


def steady(result: dict[str, Any]) -> dict[str, Any]:
    """Drift once the prefix cache is full (its bytes first within 5% of their maximum, and not before
    the warm-up ends), and the drift of RSS less the cache's bytes over the whole time after the
    warm-up: growth that is neither the cache filling its budget nor gone again is a leak."""
    samples, cache = result["samples"], result["prefix_cache_mb"]
    pairs = [(t, m, c) for (t, m), c in zip(samples, cache, strict=False) if c >= 0 and t >= result["warmup_s"]]
    if len(pairs) < 2:
        return {}
    top = max(c for _, _, c in pairs)
    full = next(i for i, (_, _, c) in enumerate(pairs) if c >= 0.95 * top)
    t_full, m_full, _ = pairs[full]
    rest = pairs[full:]
    rss_less = [m - c for _, m, c in pairs]
    t_end = rest[-1][0]
    first = [m for t, m, _ in rest if t < t_full + 600]
    last = [m for t, m, _ in rest if t >= t_end - 600]
    mean_drift = round(100 * (sum(last) / len(last) - sum(first) / len(first)) / (sum(first) / len(first)), 2)
    return {"prefix_cache_full_at_s": t_full, "prefix_cache_max_mb": top,
            "rss_at_cache_full_mb": m_full, "rss_end_mb": rest[-1][1],
            "drift_after_cache_full_pct": round(100 * (rest[-1][1] - m_full) / m_full, 2),
            "max_drift_after_cache_full_pct": round(100 * (max(m for _, m, _ in rest) - m_full) / m_full, 2),
            # RSS saw-tooths by tens of MB as the cache evicts and refills: means, not single samples
            "mean_drift_last_vs_first_10_min_after_cache_full_pct": mean_drift,
            "rss_less_cache_mb_after_warmup_and_end": [round(rss_less[0], 1), round(rss_less[-1], 1)],
            "rss_less_cache_drift_pct": round(100 * (rss_less[-1] - rss_less[0]) / rss_less[0], 2)}


def plot(result: dict[str, Any], path: Path) -> None:
    """RSS, with the prefix cache's bytes and (where sampled) the anonymous memory and ``[heap]``."""
    times = [t for t, _ in result["samples"]]
    series = {"prefix cache": [(t, c) for t, c in zip(times, result["prefix_cache_mb"], strict=False) if c >= 0]}
    split = result.get("anon_file_heap_mb") or []
    if split:
        series["anonymous"] = [(t, s[0]) for t, s in zip(times, split, strict=False) if s[0] >= 0]
        series["[heap]"] = [(t, s[2]) for t, s in zip(times, split, strict=False) if s[2] >= 0]
    drift = result.get("steady", {}).get("drift_after_cache_full_pct", result["drift_pct"])
    plot_rss(path, result["samples"], result["warmup_s"],
             f"mixed soak: {result['requests']} requests, {result['errors']} errors, "
             f"drift once the prefix cache is full {drift}%", series=series)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--scale", type=int, default=1, help="clients of each kind (agent loops: 3x)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--sample-every", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=300, help="seconds before drift is measured")
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--kv-cache-mb", type=int, default=512,
                    help="the server's KV budget, prefix cache included (0: the auto budget, half the free "
                         "memory: the prefix cache then fills it for as long as the soak runs)")
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--port", type=int, default=8791)
    ap.add_argument("--lora", action=argparse.BooleanOptionalAction, default=True,
                    help="a client whose chats name a LoRA adapter of the base (imported at start)")
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--summarize", type=Path, default=None, help="only recompute the steady-state figures of a saved run")
    args = ap.parse_args()
    if args.summarize:   # a saved run: its steady-state figures again (and its chart, with --plot)
        saved = json.loads(args.summarize.read_text(encoding="utf-8"))
        saved["steady"] = steady(saved)
        if args.plot:
            plot(saved, args.plot)
        emit(saved["steady"])
        return
    path, model_id = model_dir(args.model)
    home = Path(tempfile.mkdtemp(prefix="soak-mix-home-"))
    for variant in path.parent.glob("all-minilm-l6-v2--*"):
        shutil.copytree(variant, home / "models" / variant.name)
    env = {**os.environ, "ORTSERVE_HOME": str(home), "ORTSERVE_LOG_LEVEL": "warning",
           "ORTSERVE_KV_CACHE_MB": str(args.kv_cache_mb)}
    env.pop("ORTSERVE_API_KEY", None)
    if args.lora:   # the base inside the home, so an adapter imported there is served with it
        from lora import random_adapters, write_peft

        shutil.copytree(path, home / "models" / path.name)
        path = home / "models" / path.name
        peft = write_peft(random_adapters(path, 1, 8)[0], home / "peft-src", 8)
        subprocess.run([sys.executable, "-m", "ortserve.cli.main", "models", "import-adapter", str(peft),
                        "--base", model_id, "--id", LORA_ID], env=env, check=True)
    server = subprocess.Popen([sys.executable, "-m", "ortserve.cli.main", "serve", "--model", str(path),
                               "--port", str(args.port)], env=env)
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_healthy(url, 300, poll=0.5)
        result = {"benchmark": "soak_mix", "model": model_id, "machine": machine(),
                  **asyncio.run(run(url, server.pid, args))}
        cpu = psutil.Process(server.pid).cpu_times()
        result["server_cpu_s"] = round(cpu.user + cpu.system)
        result["steady"] = steady(result)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(home, ignore_errors=True)
    result["loadavg_at_end"] = os.getloadavg()
    if args.plot:
        plot(result, args.plot)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    emit({k: v for k, v in result.items() if k != "samples"})


if __name__ == "__main__":
    main()
