"""The engine survives: chunked prefill, per-row failure isolation, KV budget admission and
preemption, on the tiny model (real ONNX Runtime session, real KV cache)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.errors import InvalidRequest
from ortserve.types import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
PROMPTS = [f"Request {i}: a few words about the colour number {i * 13}." for i in range(6)]
LONG = " ".join(f"item{i} is next to item{i + 1}." for i in range(60))  # ~600 tokens


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    eng = AsyncEngine.load(tiny_model, load_settings(max_batch=8))
    eng.core.start()
    yield eng
    eng.core.stop()


def run(coro):
    return asyncio.run(coro)


async def gather(engine: AsyncEngine, prompts: list[str], params: SamplingParams = GREEDY,
                 ids: list[str] | None = None):
    return await asyncio.gather(*(engine.generate(prompt=p, params=params,
                                                  request_id=ids[i] if ids else None)
                                  for i, p in enumerate(prompts)), return_exceptions=True)


@pytest.fixture(scope="module")
def singles(engine: AsyncEngine) -> list[str]:
    return [run(engine.generate(prompt=p, params=GREEDY)).text for p in PROMPTS + [LONG]]


def test_chunked_prefill_gives_the_same_tokens_and_interleaves_decode(engine, singles) -> None:
    core = engine.core
    whole = core.chunk_tokens
    assert len(engine.codec.encode(LONG)) > 4 * 64
    decoded_while_prefilling = []
    orig_decode = core._decode

    def spy(batch):  # runs in the engine thread: was a long prompt half prefilled at this step?
        if core.prefilling is not None:
            decoded_while_prefilling.append(len(batch))
        orig_decode(batch)

    core._decode = spy
    core.chunk_tokens = 64
    try:
        long = long_beside_a_stream(engine, PROMPTS[0], 200)
        chunked_alone = run(engine.generate(prompt=LONG, params=GREEDY))
    finally:
        core.chunk_tokens = whole
        del core._decode
    assert long.text == chunked_alone.text == singles[-1]
    assert decoded_while_prefilling, "running streams should decode between the chunks"


@pytest.mark.parametrize("ratio", [1e-6, 0.7])
def test_time_budgeted_prefill_gives_the_same_tokens(engine, singles, ratio) -> None:
    """The time budget only changes where a prompt is cut (down to MIN_CHUNK tokens), never the tokens."""
    core = engine.core
    saved = core.prefill_ratio, core.chunk_tokens
    chunks: list[tuple[int, int]] = []  # (tokens in the chunk, sequences decoding) for each prefill call
    orig_prefill = core.runner.prefill

    def spy(row, ids, **kw):
        chunks.append((len(ids), len(core.running)))
        return orig_prefill(row, ids, **kw)

    core.runner.prefill = spy
    core.prefill_ratio, core.chunk_tokens = ratio, 256
    try:
        long = long_beside_a_stream(engine, PROMPTS[1], 300)
    finally:
        core.prefill_ratio, core.chunk_tokens = saved
        del core.runner.prefill
    assert long.text == singles[-1]
    beside_decode = [n for n, decoding in chunks if decoding]
    assert len(beside_decode) > 2, "the long prompt should be prefilled in several chunks beside the stream"
    assert all(16 <= n <= 256 for n in beside_decode[:-1]), beside_decode  # the last: what is left
    if ratio == 1e-6:  # a budget far below one token: the floor (0.7 lands where the timings say)
        assert beside_decode[:-1] == [16] * (len(beside_decode) - 1)


def test_a_fault_in_one_row_ends_only_that_request(engine, singles) -> None:
    for where in ("step", "postprocess"):
        ids = [f"{where}-{i}" for i in range(4)]
        engine.core.plant_fault(ids[2], RuntimeError(f"planted {where} fault"), where)
        outs = run(gather(engine, PROMPTS[:4], ids=ids))
        assert [o.text for i, o in enumerate(outs) if i != 2] == [singles[i] for i in (0, 1, 3)]
        assert all(o.finish_reason == "length" for i, o in enumerate(outs) if i != 2)
        assert outs[2].finish_reason == "error"
        assert not engine.core.faults
    assert engine.core.failed_rows >= 2
    # and the engine keeps serving
    assert run(engine.generate(prompt=PROMPTS[5], params=GREEDY)).text == singles[5]


def test_forced_preemption_gives_the_same_greedy_tokens(engine, singles) -> None:
    core = engine.core
    bpt = core.runner.bytes_per_token
    saved = core.kv_budget
    # room for about two full sequences: six must take turns, preempting and recomputing
    prompt_len = max(len(engine.codec.encode(p)) for p in PROMPTS)
    core.kv_budget = core.runner.byte_limit = 3 * (prompt_len + GREEDY.max_tokens) * bpt
    before = core.preemptions
    try:
        outs = run(gather(engine, PROMPTS))
    finally:
        core.kv_budget = core.runner.byte_limit = saved
    assert core.preemptions > before
    assert [o.text for o in outs] == singles[:6]
    assert all(o.finish_reason == "length" for o in outs)


def test_a_request_that_can_never_fit_is_refused_at_once(engine) -> None:
    core = engine.core
    saved = core.kv_budget
    core.kv_budget = 100 * core.runner.bytes_per_token
    try:
        with pytest.raises(InvalidRequest) as err:
            engine.prepare(prompt=PROMPTS[0], params=SamplingParams(max_tokens=200))
    finally:
        core.kv_budget = saved
    assert err.value.status == 400 and err.value.param == "max_tokens"
    assert err.value.code == "kv_budget_exceeded" and "kv_cache_mb" in err.value.message


def test_chat_drops_the_oldest_turns_and_tells_the_user(tiny_model: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    turns = [f"Turn {i}: " + "tell me more about the long river and the old bridge " * 4 for i in range(5)]
    r = subprocess.run([sys.executable, "-m", "ortserve.cli.main", "chat", "--model", str(tiny_model),
                        "--max-length", "200", "--max-tokens", "24", "--temperature", "0"],
                       input="\n".join([*turns, "word " * 400, "still here?", "/exit"]) + "\n",
                       capture_output=True, text=True, timeout=300, check=False,
                       env={**os.environ, "ORTSERVE_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "outgrew the 200-token context: dropped the 2 oldest messages" in r.stderr
    assert "error:" in r.stderr and "context length" in r.stderr  # one message too long alone: said, not fatal
    assert r.stdout.count(">>> ") == len(turns) + 3  # every prompt came back, up to /exit


def long_beside_a_stream(engine, short_prompt: str, short_tokens: int):
    """LONG, sent while a greedy stream of ``short_tokens`` on ``short_prompt`` is decoding; its result.
    The prefix cache is off meanwhile: ``singles`` cached LONG, and a cached prompt needs no chunks."""
    async def scenario():
        decoding = asyncio.Event()

        async def stream():  # one token per step (no speculation): a step that skips it is visible
            async for ev in engine.submit(prompt=short_prompt, params=SamplingParams(
                    temperature=0, max_tokens=short_tokens, ignore_eos=True, speculative=False)):
                decoding.set()
                if ev.finished:
                    return ev

        short = asyncio.ensure_future(stream())
        await decoding.wait()  # the stream is decoding when LONG arrives, however fast the machine
        long = await engine.generate(prompt=LONG, params=GREEDY)
        assert not short.done(), "the stream should still be decoding when LONG is done"
        await short
        return long
    cache, engine.core.cache = engine.core.cache, None
    try:
        return run(scenario())
    finally:
        engine.core.cache = cache
