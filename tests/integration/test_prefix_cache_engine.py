"""Prefix reuse on the tiny model (real ONNX Runtime session, real KV rows): the same tokens
with reuse on and off, a shared prefix prefilled once, nothing half-written ever matched, and
the KV budget kept."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.types import SamplingParams

SYSTEM = "You are a careful agent. " + " ".join(f"Tool {i} reads file{i}.txt and returns its lines." for i in range(40))
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=24, ignore_eos=True)
QUESTIONS = ["What does tool 3 read?", "And tool 17?", "List the tools about files.", "Thanks, summarise."]


def load(model: Path, **kw) -> AsyncEngine:
    eng = AsyncEngine.load(model, load_settings(max_batch=8, **kw))
    eng.core.start()
    return eng


@pytest.fixture(scope="module")
def on(tiny_model: Path):
    eng = load(tiny_model)
    yield eng
    eng.core.stop()


@pytest.fixture(scope="module")
def off(tiny_model: Path):
    eng = load(tiny_model, prefix_cache=False)
    assert eng.core.cache is None
    yield eng
    eng.core.stop()


def run(coro):
    return asyncio.run(coro)


def agent_loop(engine: AsyncEngine, params: SamplingParams, system: str = SYSTEM) -> list[tuple[str, int]]:
    """Turns that resend the whole conversation; each answer's text and its cached_tokens."""
    messages, out = [{"role": "system", "content": system}], []
    for q in QUESTIONS:
        messages.append({"role": "user", "content": q})
        res = run(engine.generate(messages=messages, params=params))
        messages.append({"role": "assistant", "content": res.text})
        out.append((res.text, res.metrics.cached_tokens))
    return out


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_an_agent_loop_gives_the_same_tokens_with_reuse_on_and_off(on, off, params) -> None:
    system = f"{params.temperature}: {SYSTEM}"  # its own prefix: earlier tests leave nothing to reuse
    with_reuse, without = agent_loop(on, params, system), agent_loop(off, params, system)
    assert [t for t, _ in with_reuse] == [t for t, _ in without]
    assert all(c == 0 for _, c in without)
    system_tokens = on.count_tokens(system)
    assert with_reuse[0][1] < system_tokens  # turn 1: at most the chat template's opening matched
    assert all(c > system_tokens for _, c in with_reuse[1:]), with_reuse  # later turns: the history


def test_concurrent_requests_share_one_prefill_of_their_prefix(on, off) -> None:
    system = "Shared instructions. " + SYSTEM
    prompts = [[{"role": "system", "content": system}, {"role": "user", "content": f"Agent {i}: status?"}]
               for i in range(8)]

    async def burst(engine: AsyncEngine) -> list[str]:
        outs = await asyncio.gather(*(engine.generate(messages=m, params=GREEDY) for m in prompts))
        return [o.text for o in outs]

    before = on.stats()
    texts = run(burst(on))
    after = on.stats()
    assert texts == run(burst(off))
    lengths = [len(on.prepare(messages=m)[0]) for m in prompts]
    shared = on.count_tokens(system)
    computed = after.prompt_tokens_computed - before.prompt_tokens_computed
    reused = after.prompt_tokens_reused - before.prompt_tokens_reused
    assert computed + reused == sum(lengths)
    # the shared instructions are computed once; the other seven copy them
    assert computed < sum(lengths) - 7 * shared + 64, (computed, lengths, shared)


def test_a_prefill_that_fails_or_is_cancelled_midway_leaves_nothing_to_match(on, off) -> None:
    core = on.core
    chunk = core.chunk_tokens
    prompts = {where: f"{where}: " + " ".join(f"item{i} sits beside item{i + 1}." for i in range(50))
               for where in ("fail", "cancel")}
    calls: list[str] = []
    orig = core.runner.prefill

    def planted(row, ids, **kw):  # runs in the engine thread, once per chunk
        seq = core.prefilling
        calls.append(seq.id)
        if calls.count(seq.id) == 2 and seq.id == "fail":
            raise RuntimeError("planted kernel failure on the second chunk")
        if calls.count(seq.id) == 2 and seq.id == "cancel":
            core.abort("cancel")  # applied before the next step: the third chunk never runs
        return orig(row, ids, **kw)

    core.runner.prefill, core.chunk_tokens = planted, 32
    try:
        failed = run(on.generate(prompt=prompts["fail"], params=GREEDY, request_id="fail"))
        cancelled = run(cancel_midway(on, prompts["cancel"]))
    finally:
        del core.runner.prefill
        core.chunk_tokens = chunk
    assert failed.finish_reason == "error"
    assert cancelled == "abort"
    for where, prompt in prompts.items():
        ids = on.prepare(prompt=prompt)[0]
        _, n = core.cache.match(np.asarray(ids))
        assert n < 16, f"{where}: a half-written prefix of {n} tokens is cached"
        again = run(on.generate(prompt=prompt, params=GREEDY))
        assert again.metrics.cached_tokens < 16
        assert again.text == run(off.generate(prompt=prompt, params=GREEDY)).text


async def cancel_midway(engine: AsyncEngine, prompt: str) -> str | None:
    handle = engine.submit(prompt=prompt, params=GREEDY, request_id="cancel")
    async for ev in handle:
        if ev.finished:
            return ev.finish_reason
    return None


def test_preemption_and_eviction_keep_the_tokens_and_the_budget(on, off) -> None:
    core = on.core
    bpt = core.runner.bytes_per_token
    saved = core.kv_budget
    prompts = [f"{SYSTEM[:300]} Case {i}: what is {i} times {i}?" for i in range(6)]
    plen = max(len(on.prepare(prompt=p)[0]) for p in prompts)
    # two rows are admitted (their prompts and 16 tokens of headroom), and grow past it: preemption
    core.kv_budget = 2 * (plen + 20) * bpt

    async def all_at_once(engine: AsyncEngine) -> list[str]:
        return [o.text for o in await asyncio.gather(*(engine.generate(prompt=p, params=GREEDY) for p in prompts))]

    over: list[tuple[int, int]] = []
    orig_step = core.step

    def step() -> None:  # after every step: the rows in use and the cached prefixes fit the budget together
        orig_step()
        rows = len(core.running) + (core.prefilling is not None)
        in_use = rows * int(core.runner.lengths[:max(rows, 1)].max()) * bpt
        if in_use + core.cache.nbytes > core.kv_budget:
            over.append((in_use, core.cache.nbytes))

    before, evictions = core.preemptions, core.cache.evictions
    core.step = step
    try:
        texts = run(all_at_once(on))
        again = run(all_at_once(on))  # now from whatever the cache kept
    finally:
        core.kv_budget = saved
        del core.step
    assert not over, over
    assert core.preemptions > before
    assert core.cache.evictions > evictions
    reference = run(all_at_once(off))
    assert texts == again == reference


def test_structured_output_after_a_cached_prefix_is_unchanged(on, off) -> None:
    schema = {"type": "object", "properties": {"tool": {"type": "integer"}}, "required": ["tool"]}
    params = SamplingParams(temperature=0, max_tokens=40, json_schema=schema)
    messages = [{"role": "system", "content": "JSON please. " + SYSTEM}, {"role": "user", "content": "Which tool?"}]
    first = run(on.generate(messages=messages, params=params))
    second = run(on.generate(messages=messages, params=params))  # the grammar starts fresh; the KV is reused
    assert second.metrics.cached_tokens > 0
    assert first.text == second.text == run(off.generate(messages=messages, params=params)).text


def test_device_placed_kv_reuses_prefixes_too(tiny_model: Path, off) -> None:
    """The same reuse with the KV as OrtValues (the CUDA/DirectML path, run on the CPU provider):
    rows are cropped out and padded back in by the tiny Pad graph."""
    eng = load(tiny_model, kv_placement="device")
    try:
        assert type(eng.core.runner.kv).__name__ == "DeviceKV"
        system = "device " + SYSTEM
        turns = agent_loop(eng, GREEDY, system)
        assert [t for t, _ in turns] == [t for t, _ in agent_loop(off, GREEDY, system)]
        assert all(c > eng.count_tokens(system) for _, c in turns[1:]), turns
    finally:
        eng.core.stop()


def test_a_restart_drops_the_cache(tiny_model: Path) -> None:
    eng = load(tiny_model)
    try:
        run(eng.generate(prompt=SYSTEM, params=GREEDY))
        deadline = time.monotonic() + 120  # the row is kept when the step that finished it retires it
        while not eng.core.cache.entries and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eng.core.cache.entries and eng.stats().prefix_cache_bytes > 0
        eng.core.stop()
        eng.reload()  # what the watchdog does
        assert eng.core.cache.entries == [] and eng.stats().prefix_cache_bytes == 0
        assert run(eng.generate(prompt=SYSTEM, params=GREEDY)).metrics.cached_tokens == 0
    finally:
        eng.core.stop()


def test_a_flood_of_distinct_prompts_stays_inside_the_kv_budget(tiny_model: Path) -> None:
    """200 distinct ~1k-token prompts: the cache keeps evicting, its bytes and the process's
    memory stay bounded by kv_cache_mb (kept unbounded, they would hold 200 prompts' KV)."""
    import psutil

    eng = load(tiny_model, kv_cache_mb=8)
    proc = psutil.Process()
    try:
        core, params = eng.core, SamplingParams(temperature=0, max_tokens=1)
        prompts = [f"Document {i}: " + " ".join(f"w{i}x{j}" for j in range(250)) for i in range(200)]
        n = len(eng.prepare(prompt=prompts[0], params=params)[0])
        assert 800 < n < eng.context_length
        run(eng.generate(prompt=prompts[0], params=params))
        rss0 = proc.memory_info().rss
        peak_cache = 0
        for p in prompts[1:]:
            run(eng.generate(prompt=p, params=params))
            peak_cache = max(peak_cache, core.cache.nbytes)
        unbounded = 200 * n * core.runner.bytes_per_token
        assert core.cache.evictions > 150 and peak_cache <= 8 << 20 < unbounded / 4
        assert proc.memory_info().rss - rss0 < unbounded / 2, (proc.memory_info().rss - rss0, unbounded)
    finally:
        eng.core.stop()
