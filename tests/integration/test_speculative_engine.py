"""Prompt-lookup speculation on real models (engine/speculation/speculate.py): greedy tokens identical with it
on and off, sampled tokens distributed the same (the rejection rule), grammars, penalties and the
prefix cache unchanged, and the counters showing what was guessed and accepted."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.types import SamplingParams

PASSAGE = ("The warranty covers parts and labour for two years from the date of purchase. "
           "Claims must include the receipt, the serial number and a short description of the fault. ")
COPY = [f"Passage: {PASSAGE}\nQuote the passage exactly.\nQuote: {PASSAGE[:40]}",
        'Return {"name": "ada", "age": 36, "city": "london", "tags": ["x", "y"]} with age 37: {"name": "ada", ',
        "one two three four one two three four one two three four one two"]
FREE = "Write a short story about a lighthouse keeper."


def load(model: Path, **kw) -> AsyncEngine:
    eng = AsyncEngine.load(model, load_settings(max_batch=4, prefix_cache=False, **kw))
    eng.core.start()
    return eng


@pytest.fixture(scope="module")
def tiny(tiny_model: Path):
    eng = load(tiny_model)
    yield eng
    eng.core.stop()


def gen(eng: AsyncEngine, prompt: str, params: SamplingParams, speculative: bool = True):
    eng.core.speculative = speculative
    try:
        return asyncio.run(eng.generate(prompt=prompt, params=params))
    finally:
        eng.core.speculative = True


def tokens(eng: AsyncEngine, prompt: str, params: SamplingParams, speculative: bool) -> tuple[str, object]:
    res = gen(eng, prompt, params, speculative)
    return res.text, res.metrics.speculative


def copy_bias(eng: AsyncEngine) -> dict[str, float]:
    """A bias on the words of COPY[2]: the tiny random model then repeats them, as a real model
    repeats its context, so guesses are accepted (unbiased it writes tokens it never repeats)."""
    return {str(t): 12.0 for t in eng.codec.encode(" one two three four")}


@pytest.mark.parametrize("extra", [{}, {"repetition_penalty": 1.3, "frequency_penalty": 0.5}, {"min_tokens": 4}],
                         ids=["plain", "penalties", "min_tokens"])
def test_greedy_tokens_are_identical_with_speculation_on_and_off(tiny, extra) -> None:
    before = tiny.core.spec_accepted
    for bias in ({}, copy_bias(tiny)):
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logit_bias=bias, **extra)
        for prompt in COPY + [FREE]:
            on, stats = tokens(tiny, prompt, params, True)
            off, none = tokens(tiny, prompt, params, False)
            assert on == off, prompt
            assert none is None and stats is not None and stats["proposed"] >= stats["accepted"]
    assert tiny.core.spec_accepted > before  # guesses were accepted, not only rejected
    assert tiny.core.stats().speculative_accepted == tiny.core.spec_accepted


def test_max_tokens_and_the_context_bound_what_a_verify_step_takes(tiny) -> None:
    for n in (1, 2, 3, 5):
        res = gen(tiny, COPY[2], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        assert res.metrics.output_tokens == n and res.finish_reason == "length"


def test_a_request_can_turn_it_off(tiny) -> None:
    before = tiny.core.spec_proposed
    res = asyncio.run(tiny.generate(prompt=COPY[2], params=SamplingParams(temperature=0, max_tokens=20,
                                                                           speculative=False)))
    assert res.metrics.speculative is None and tiny.core.spec_proposed == before


def test_grammar_rows_verify_every_guess_against_their_mask(tiny) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    params = SamplingParams(temperature=0, max_tokens=40, json_schema=schema)
    on, _ = tokens(tiny, COPY[1], params, True)
    off, _ = tokens(tiny, COPY[1], params, False)
    assert on == off


def test_sampled_tokens_follow_the_same_distribution(tiny) -> None:
    """The rejection rule keeps the output distribution: over many seeds, the empirical distribution
    of each of the first output tokens with speculation on and off differ by total variation < 0.12
    (400 draws over a handful of tokens: the sampling noise of TV is about 0.03-0.05)."""
    eng = tiny
    try:
        # a bias concentrates the tiny model's near-uniform distribution on the prompt's words, so the
        # n-gram guesses are right part of the time (acceptance strictly between 0 and 1)
        bias = copy_bias(eng)
        def draws(speculative: bool) -> list[tuple[int, ...]]:
            eng.core.speculative = speculative
            out = []
            for seed in range(400):
                p = SamplingParams(temperature=1.0, seed=seed, max_tokens=4, ignore_eos=True, logit_bias=bias)
                res = asyncio.run(eng.generate(prompt=COPY[2], params=p))
                out.append(tuple(res.text.split()))
            return out
        before = (eng.core.spec_proposed, eng.core.spec_accepted)
        on = draws(True)
        proposed, accepted = eng.core.spec_proposed - before[0], eng.core.spec_accepted - before[1]
        off = draws(False)
        assert 0 < accepted < proposed
        for pos in range(1, 4):
            a = collections.Counter(d[pos] if len(d) > pos else None for d in on)
            b = collections.Counter(d[pos] if len(d) > pos else None for d in off)
            tv = sum(abs(a[k] - b[k]) for k in a.keys() | b.keys()) / 2 / len(on)
            assert tv < 0.12, (pos, tv, a, b)
    finally:
        eng.core.speculative = True


def test_the_prefix_cache_holds_only_accepted_kv_after_speculating(tiny, tiny_model: Path) -> None:
    """Turns that resend the conversation start from a speculating request's saved row: a rejected
    guess's KV left in it would change the next answers."""
    cached = AsyncEngine.load(tiny_model, load_settings(max_batch=4))  # prefix cache on
    cached.core.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logit_bias=copy_bias(tiny))

        def loop(eng: AsyncEngine, speculative: bool) -> list[str]:
            eng.core.speculative = speculative
            messages, out = [{"role": "system", "content": COPY[2]}], []
            for q in ("Repeat the words.", "Again, longer.", "And once more."):
                messages.append({"role": "user", "content": q})
                res = asyncio.run(eng.generate(messages=messages, params=params))
                messages.append({"role": "assistant", "content": res.text})
                out.append(res.text)
            return out

        before = cached.core.spec_accepted
        with_cache = loop(cached, True)
        assert cached.core.spec_accepted > before and cached.core.stats().prompt_tokens_reused > 0
        assert with_cache == loop(tiny, False)  # no cache, no speculation
    finally:
        cached.core.stop()
        tiny.core.speculative = True
