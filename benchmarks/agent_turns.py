"""Agent workloads with and without prefix reuse (issue 30); prints JSON.

    .venv/bin/python benchmarks/agent_turns.py [--model smollm2-135m] [--turns 8] [--agents 16]
        [--max-tokens 48] [--words 1500] [--skip-off] [--decode-only]

* ``agent_loop``: a ~1,500-word system prompt (tool docs), then ``--turns`` turns, each resending
  the whole conversation (streaming, greedy). TTFT per turn (client side: submit to the first
  streamed token), and the median of turns 2..n over turn 1.
* ``shared_prompt``: ``--agents`` concurrent requests with one system prompt (a different one,
  so the agent loop left nothing of it cached) and their own question: prompt tokens computed
  and reused (the engine's counters, as on /metrics), and TTFT p50/p95.
* ``decode``: one stream of 128 tokens on a short prompt, time per output token, the two
  engines taking turns (6 pairs; the ratio is the median of the pairs').
* ``parallel16``: 16 streams of 64 tokens at once, total tokens/s, the engines taking turns
  (3 pairs).

Both engines (prefix cache on, the default, and ``prefix_cache=False`` unless ``--skip-off``)
are loaded in one process with the same model and settings; the agent parts run on one, then
the other.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _common import emit, machine, median, model_dir, pct

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.types import SamplingParams

QUESTIONS = [
    "List the files in the project root.", "Read setup.cfg and tell me the package name.",
    "Which tool would you use to search for TODO comments?", "Search for TODO comments in src.",
    "Summarise what you found so far in two sentences.", "Open the README and find the install steps.",
    "Propose a fix for the failing test in tests/test_io.py.", "Write the commit message for that fix.",
    "Check the changelog for the last release.", "Thank you. Anything else I should know?",
]
TOOLS = ["read_file", "write_file", "list_dir", "search", "run_tests", "git_diff", "git_commit", "http_get",
         "summarise", "ask_user", "open_issue", "close_issue"]


def system_prompt(words: int, team: str = "") -> str:
    """Tool documentation of about ``words`` words, deterministic."""
    lines = [f"{team}You are a coding agent working in a repository. Use the tools below; answer briefly."]
    i = 0
    while sum(len(line.split()) for line in lines) < words:
        tool = TOOLS[i % len(TOOLS)]
        lines.append(f"Tool {tool} (rule {i}): call it with a JSON object naming its arguments; it returns "
                     f"the result as text, or an error that says what went wrong in case {i}. Prefer it "
                     f"over guessing when the task mentions {tool.replace('_', ' ')} or item number {i * 7}.")
        i += 1
    return "\n".join(lines)


async def stream(engine: AsyncEngine, messages: list[dict[str, str]], params: SamplingParams) -> dict[str, Any]:
    t0 = time.perf_counter()
    ttft, parts, metrics = None, [], None
    async for ev in engine.submit(messages=messages, params=params):
        if ttft is None and (ev.text or ev.token_ids or ev.finished):
            ttft = time.perf_counter() - t0
        parts.append(ev.text)
        metrics = ev.metrics
    return {"ttft": ttft, "text": "".join(parts), "cached_tokens": metrics.cached_tokens if metrics else 0,
            "prompt_tokens": metrics.input_tokens if metrics else 0}


async def agent_loop(engine: AsyncEngine, system: str, turns: int, params: SamplingParams) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    rows = []
    for q in (QUESTIONS * 2)[:turns]:
        messages.append({"role": "user", "content": q})
        r = await stream(engine, messages, params)
        messages.append({"role": "assistant", "content": r["text"]})
        rows.append({k: r[k] for k in ("ttft", "prompt_tokens", "cached_tokens")})
    ttfts = [r["ttft"] for r in rows]
    return {"turns": rows, "ttft_turn1_s": ttfts[0], "ttft_later_median_s": median(ttfts[1:]),
            "later_median_over_turn1": median(ttfts[1:]) / ttfts[0] if ttfts[0] else None}


async def shared_prompt(engine: AsyncEngine, system: str, agents: int, params: SamplingParams) -> dict[str, Any]:
    before = engine.stats()
    jobs = [[{"role": "system", "content": system}, {"role": "user", "content": f"Agent {i}: {QUESTIONS[i % 10]}"}]
            for i in range(agents)]
    results = await asyncio.gather(*(stream(engine, m, params) for m in jobs))
    after = engine.stats()
    ttfts = [r["ttft"] for r in results]
    return {"agents": agents, "system_prompt_tokens": engine.count_tokens(system),
            "prompt_tokens": sum(r["prompt_tokens"] for r in results),
            "prompt_tokens_computed": after.prompt_tokens_computed - before.prompt_tokens_computed,
            "prompt_tokens_reused": after.prompt_tokens_reused - before.prompt_tokens_reused,
            "ttft_p50_s": pct(ttfts, 0.5), "ttft_p95_s": pct(ttfts, 0.95)}


async def decode(engines: dict[str, AsyncEngine], pairs: int = 6) -> dict[str, Any]:
    """One stream of 128 tokens at a time, the engines taking turns (so load changes hit both)."""
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    tpot: dict[str, list[float]] = {name: [] for name in engines}
    for i in range(pairs):
        for name in (list(engines) if i % 2 == 0 else list(engines)[::-1]):
            out = await engines[name].generate(prompt=f"Tell me a long story about river number {i}.", params=params)
            tpot[name].append(out.metrics.tpot)
    res: dict[str, Any] = {f"tpot_ms_median_{n}": 1000 * median(xs) for n, xs in tpot.items()}
    if len(engines) == 2:
        res["tpot_on_over_off_median_of_pairs"] = median([a / b for a, b in zip(tpot["on"], tpot["off"])])
    return res


async def parallel16(engines: dict[str, AsyncEngine], pairs: int = 3) -> dict[str, Any]:
    """16 streams of 64 tokens on distinct short prompts, total tokens/s, the engines taking turns."""
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    tps: dict[str, list[float]] = {name: [] for name in engines}
    for i in range(pairs):
        for name in (list(engines) if i % 2 == 0 else list(engines)[::-1]):
            t0 = time.perf_counter()
            outs = await asyncio.gather(*(engines[name].generate(
                prompt=f"Story {i}-{j}: tell me about {QUESTIONS[j % 10].lower()}", params=params) for j in range(16)))
            tps[name].append(sum(o.metrics.output_tokens for o in outs) / (time.perf_counter() - t0))
    res: dict[str, Any] = {f"tokens_per_s_median_{n}": median(xs) for n, xs in tps.items()}
    if len(engines) == 2:
        res["on_over_off_median_of_pairs"] = median([a / b for a, b in zip(tps["on"], tps["off"])])
    return res


async def workload(engine: AsyncEngine, args: argparse.Namespace) -> dict[str, Any]:
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    out = {"agent_loop": await agent_loop(engine, system_prompt(args.words), args.turns, params),
           "shared_prompt": await shared_prompt(engine, system_prompt(args.words, "Team B. "), args.agents, params)}
    s = engine.stats()
    out["prefix_cache"] = {"bytes": s.prefix_cache_bytes, "entries": s.prefix_cache_entries,
                           "evictions": s.prefix_cache_evictions}
    return out


async def run(path: Any, args: argparse.Namespace) -> dict[str, Any]:
    engines = {"on": AsyncEngine.load(path, load_settings(prefix_cache=True))}
    if not args.skip_off:
        engines["off"] = AsyncEngine.load(path, load_settings(prefix_cache=False))
    try:
        for e in engines.values():
            await e.start()
            await e.generate(prompt="Warm up.", params=SamplingParams(temperature=0, max_tokens=4))
        result: dict[str, Any] = {"decode": await decode(engines), "parallel16": await parallel16(engines)}
        if args.decode_only:
            return result
        for name, e in engines.items():  # one after the other: each has the machine to itself
            result[f"prefix_cache_{name}"] = await workload(e, args)
        return result
    finally:
        for e in engines.values():
            await e.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--words", type=int, default=1500)
    ap.add_argument("--skip-off", action="store_true", help="only the engine with the prefix cache")
    ap.add_argument("--decode-only", action="store_true", help="only the decode and 16-stream comparisons")
    args = ap.parse_args()
    path, name = model_dir(args.model)
    result: dict[str, Any] = {"benchmark": "agent_turns", "model": name, "machine": machine(),
                              "args": vars(args), "llama_server": "see benchmarks/agent_http.py (over HTTP)"}
    result.update(asyncio.run(run(path, args)))
    if not args.skip_off and not args.decode_only:
        on, off = result["prefix_cache_on"], result["prefix_cache_off"]
        result["summary"] = {
            "agent_later_turns_median_over_turn1_on": on["agent_loop"]["later_median_over_turn1"],
            "agent_later_turns_median_ttft_on_over_off": on["agent_loop"]["ttft_later_median_s"]
            / off["agent_loop"]["ttft_later_median_s"],
            "shared_prompt_tokens_computed_on_over_off": on["shared_prompt"]["prompt_tokens_computed"]
            / off["shared_prompt"]["prompt_tokens_computed"],
            "decode_tpot_on_over_off": result["decode"]["tpot_on_over_off_median_of_pairs"]}
    emit(result)


if __name__ == "__main__":
    main()
