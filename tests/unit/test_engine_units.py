"""Pieces of the engine that need no model: params validation, stop matching, sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ortserve.engine.detokenize import StopMatcher
from ortserve.engine.sampler import apply_penalties, sample
from ortserve.errors import InvalidRequest
from ortserve.types import SamplingParams


@pytest.mark.parametrize("kw,param", [
    ({"temperature": -1}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.01}, "top_p"), ({"top_k": -1}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"stop": ["a", ""]}, "stop"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"), ({"seed": "x"}, "seed"),
])
def test_sampling_params_name_the_bad_param(kw: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(**kw)
    assert err.value.param == param and param in err.value.message


def test_stop_matcher_cuts_across_deltas() -> None:
    m = StopMatcher(("END",))
    out = [m.feed(x) for x in ["hello E", "N", "D and more"]]
    assert "".join(out) == "hello " and m.stopped
    m = StopMatcher(("xyz",))
    out = [m.feed(x) for x in ["ab", "cx", "y!"]] + [m.flush()]
    assert "".join(out) == "abcxy!" and not m.stopped
    assert StopMatcher(()).feed("anything") == "anything"


def test_sampling_greedy_seeded_topk_topp() -> None:
    logits = np.log(np.array([0.05, 0.6, 0.3, 0.05], dtype=np.float32))
    assert sample(logits, SamplingParams(temperature=0), np.random.default_rng(0)) == 1
    draws = lambda p, seed: [sample(logits, p, np.random.default_rng(seed)) for _ in range(1)]
    p = SamplingParams(temperature=1.0, seed=1)
    assert draws(p, 1) == draws(p, 1)
    rng = np.random.default_rng(0)
    top1 = {sample(logits, SamplingParams(temperature=1.0, top_k=2), rng) for _ in range(200)}
    assert top1 == {1, 2}
    nucleus = {sample(logits, SamplingParams(temperature=1.0, top_p=0.5), rng) for _ in range(200)}
    assert nucleus == {1}
    everything = {sample(logits, SamplingParams(temperature=1.0), rng) for _ in range(2000)}
    assert everything == {0, 1, 2, 3}


def test_penalties_push_seen_tokens_down() -> None:
    logits = np.array([2.0, 2.0, -1.0], dtype=np.float32)
    out = apply_penalties(logits.copy(), SamplingParams(repetition_penalty=2.0), [0], {2: 1})
    assert out[0] == 1.0 and out[1] == 2.0 and out[2] == -2.0
    out = apply_penalties(logits.copy(), SamplingParams(frequency_penalty=0.5, presence_penalty=1.0), [], {1: 2})
    assert out[1] == pytest.approx(2.0 - 1.0 - 1.0) and out[0] == 2.0
