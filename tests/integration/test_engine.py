"""The engine on the tiny model: batching, streaming, sampling, limits, cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.engine.detokenize import IncrementalDetokenizer
from ortserve.engine.tokenizer import TextCodec
from ortserve.errors import ContextLengthExceeded
from ortserve.types import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [f"Question {i}: tell me about the number {i * 7}." for i in range(16)]


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    eng = AsyncEngine.load(tiny_model, load_settings(max_batch=16))
    eng.core.start()
    yield eng
    eng.core.stop()


def run(coro):  # each test drives the shared engine from its own event loop
    return asyncio.run(coro)


async def stream_text(engine: AsyncEngine, **kw) -> tuple[list[str], object]:
    pieces, last = [], None
    async for ev in engine.submit(**kw):
        pieces.append(ev.text)
        last = ev
    return pieces, last


async def stream_events(engine: AsyncEngine, **kw) -> list:
    return [ev async for ev in engine.submit(**kw)]


def test_greedy_is_deterministic_and_streaming_equals_whole(engine: AsyncEngine) -> None:
    a = run(engine.generate(prompt=PROMPTS[0], params=GREEDY))
    b = run(engine.generate(prompt=PROMPTS[0], params=GREEDY))
    pieces, last = run(stream_text(engine, prompt=PROMPTS[0], params=GREEDY))
    assert a.text == b.text and a.text
    assert "".join(pieces) == a.text
    assert last.finished and last.finish_reason == "length"
    m = last.metrics
    assert m.output_tokens == 24 and m.input_tokens > 0
    assert m.ttft is not None and 0 < m.ttft <= m.total_latency
    assert m.tpot is not None and m.tpot > 0 and m.output_tokens_per_second > 0


def test_seed_reproduces_and_differs(engine: AsyncEngine) -> None:
    def p(seed: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, top_p=0.95, top_k=40, max_tokens=24, seed=seed, ignore_eos=True)

    a = run(engine.generate(prompt=PROMPTS[1], params=p(7)))
    b = run(engine.generate(prompt=PROMPTS[1], params=p(7)))
    c = run(engine.generate(prompt=PROMPTS[1], params=p(8)))
    assert a.text == b.text
    assert a.text != c.text


def test_stop_string_spanning_tokens_is_cut(engine: AsyncEngine) -> None:
    events = run(stream_events(engine, prompt=PROMPTS[2], params=GREEDY))
    full = "".join(ev.text for ev in events)
    # each generated token's own text: an event carries several tokens when the client reads
    # slower than the engine decodes (coalesce), so the events' pieces are not the tokens
    tokens = [engine.codec.decode([t]) for ev in events for t in ev.token_ids]
    words = [t for t in tokens if len(t.strip()) >= 2]
    k = next(i for i in range(len(tokens) - 1) if len(tokens[i].strip()) >= 2 and len(tokens[i + 1].strip()) >= 2
             and "\ufffd" not in tokens[i] + tokens[i + 1])
    stop = tokens[k][-2:] + tokens[k + 1][:2]  # ends one token, starts the next
    expected = full[: full.index(stop)]
    out = run(engine.generate(prompt=PROMPTS[2], params=SamplingParams(temperature=0, max_tokens=24,
                                                                         ignore_eos=True, stop=[stop])))
    assert words and out.finish_reason == "stop"
    assert out.text == expected
    assert stop not in out.text
    # streamed with the stop string: the same text, and no piece leaks part of the stop
    pieces2, last2 = run(stream_text(engine, prompt=PROMPTS[2], params=SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, stop=[stop])))
    assert "".join(pieces2) == expected and last2.finish_reason == "stop"


def test_utf8_streaming_never_splits_characters(engine: AsyncEngine) -> None:
    codec: TextCodec = engine.codec
    text = "Hello 😀 世界 🎉 naïve café — 東京タワー 🚀🚀"
    ids = codec.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # emoji and CJK take several byte tokens
    detok = IncrementalDetokenizer(codec.decode)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == codec.decode(ids) == text
    # and through the engine: sampled byte tokens never surface as U+FFFD mid-stream
    pieces, _ = run(stream_text(engine, prompt=text, params=SamplingParams(
        temperature=1.0, max_tokens=48, seed=3, ignore_eos=True)))
    assert all("\ufffd" not in p for p in pieces[:-1])


def test_context_length_is_checked_before_generation(engine: AsyncEngine) -> None:
    limit = engine.context_length
    with pytest.raises(ContextLengthExceeded) as err:
        engine.prepare(prompt="hello", params=SamplingParams(max_tokens=limit))
    assert str(limit) in err.value.message and err.value.param == "max_tokens"
    long_prompt = "word " * (limit + 10)
    with pytest.raises(ContextLengthExceeded) as err:
        engine.prepare(prompt=long_prompt, params=SamplingParams(max_tokens=1))
    assert err.value.param == "prompt" and str(limit) in err.value.message


def test_sixteen_concurrent_requests_match_their_single_outputs(engine: AsyncEngine) -> None:
    singles = [run(engine.generate(prompt=p, params=GREEDY)).text for p in PROMPTS]

    async def together():
        return await asyncio.gather(*(engine.generate(prompt=p, params=GREEDY) for p in PROMPTS))

    outs = run(together())
    # Batched rows run the same kernels on the same KV rows; on this CPU build they are
    # bit-identical to single runs. No cross-talk: each equals its own single output.
    assert [o.text for o in outs] == singles
    assert len(set(singles)) > 1


def test_abort_frees_the_slot(engine: AsyncEngine) -> None:
    async def scenario():
        long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        handles = [engine.submit(prompt=p, params=long) for p in PROMPTS[:6]]
        first = handles[0].__aiter__()
        await first.__anext__()          # one of them is generating
        for h in handles:
            await engine.abort(h.id)
        reasons = []
        for h in handles[1:]:
            async for ev in h:
                if ev.finished:
                    reasons.append(ev.finish_reason)
        async for ev in first:
            if ev.finished:
                reasons.append(ev.finish_reason)
        for _ in range(6000):  # the event: the engine retired them; 120 s only guards a hang
            s = engine.stats()
            if s.running == 0 and s.waiting == 0:
                return reasons, s
            await asyncio.sleep(0.02)
        return reasons, engine.stats()

    reasons, stats = run(scenario())
    assert reasons == ["abort"] * 6
    assert stats.running == 0 and stats.waiting == 0


def test_min_tokens_and_penalties_are_applied(engine: AsyncEngine) -> None:
    base = run(engine.generate(prompt=PROMPTS[3], params=SamplingParams(temperature=0, max_tokens=24,
                                                                          ignore_eos=True)))
    penal = run(engine.generate(prompt=PROMPTS[3], params=SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=5.0, frequency_penalty=2.0)))
    assert penal.text != base.text
    assert penal.metrics.output_tokens == 24
