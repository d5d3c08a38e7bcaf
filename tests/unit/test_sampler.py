"""min_p, typical_p, logit_bias and seeds on the sampler with fixed logits (no model)."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from ortserve.engine.sampler import apply_penalties, make_rng, sample
from ortserve.errors import InvalidRequest
from ortserve.types import SamplingParams

# probabilities 0.5, 0.3, 0.15, 0.04, 0.01 at temperature 1
PROBS = np.array([0.5, 0.3, 0.15, 0.04, 0.01])
LOGITS = np.log(PROBS).astype(np.float32)


def draws(params: SamplingParams, n: int = 3000, logits: np.ndarray = LOGITS) -> np.ndarray:
    rng = make_rng(7)
    return np.bincount([sample(logits.copy(), params, rng) for _ in range(n)], minlength=logits.size) / n


def test_min_p_cuts_the_tail_relative_to_the_top_token() -> None:
    # min_p 0.1: keep p >= 0.05 (0.1 * 0.5): tokens 0, 1, 2; renormalised 0.5/0.95, 0.3/0.95, 0.15/0.95
    freq = draws(SamplingParams(temperature=1.0, min_p=0.1))
    assert freq[3] == 0 and freq[4] == 0
    assert freq[:3] == pytest.approx(PROBS[:3] / PROBS[:3].sum(), abs=0.03)
    # min_p 0.5: only p >= 0.25: tokens 0 and 1
    assert set(np.flatnonzero(draws(SamplingParams(temperature=1.0, min_p=0.5)))) == {0, 1}
    # without min_p the tail is drawn
    assert draws(SamplingParams(temperature=1.0))[3] > 0


def test_min_p_applies_after_temperature_and_with_top_k_and_top_p() -> None:
    # at temperature 2 the distribution flattens: p_i ∝ sqrt(PROBS); 0.04 -> sqrt ratio 0.28 >= 0.25
    hot = draws(SamplingParams(temperature=2.0, min_p=0.25))
    assert hot[3] > 0 and hot[4] == 0
    both = draws(SamplingParams(temperature=1.0, top_k=4, top_p=0.9, min_p=0.4))  # min_p keeps 0, 1
    assert set(np.flatnonzero(both)) == {0, 1}


def test_typical_p_keeps_the_tokens_nearest_the_entropy() -> None:
    # entropy of PROBS is 1.2 nats; surprisals: 0.69, 1.20, 1.90, 3.22, 4.61 -> order 1, 0, 2, 3, 4
    freq = draws(SamplingParams(temperature=1.0, typical_p=0.5))   # 0.3 < 0.5, then 0.8: keep tokens 1, 0
    assert set(np.flatnonzero(freq)) == {0, 1}
    assert set(np.flatnonzero(draws(SamplingParams(temperature=1.0, typical_p=0.2)))) == {1}


def test_logit_bias_bans_and_boosts() -> None:
    banned = SamplingParams(temperature=0, logit_bias={"0": -100})
    row = apply_penalties(LOGITS.copy(), banned, [], {})
    assert row[0] == -np.inf and sample(row, banned, make_rng(0)) == 1  # greedy takes the runner-up
    boosted = SamplingParams(temperature=1.0, logit_bias={"4": 100})
    freq = draws(boosted, 500, apply_penalties(LOGITS.copy(), boosted, [], {}))
    assert freq[4] == 1.0
    small = apply_penalties(LOGITS.copy(), SamplingParams(logit_bias={2: 1.5}), [], {})
    assert small[2] == pytest.approx(LOGITS[2] + 1.5) and small[1] == LOGITS[1]


def test_greedy_ignores_the_cuts_and_edits_only_when_asked() -> None:
    assert sample(LOGITS.copy(), SamplingParams(temperature=0, min_p=0.9, typical_p=0.1), make_rng(0)) == 0
    assert not SamplingParams(temperature=0).edits_logits
    assert SamplingParams(logit_bias={1: -3}).edits_logits


def test_seeds_reproduce_with_every_control_on_a_large_vocab() -> None:
    logits = np.random.default_rng(0).normal(0, 3, 49152).astype(np.float32)
    p = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, typical_p=0.9,
                       logit_bias={"5": -100, "9": 2.0}, seed=-5)
    def run() -> list[int]:
        rng = make_rng(p.seed)
        return [sample(apply_penalties(logits.copy(), p, [], {}), p, rng) for _ in range(50)]
    assert run() == run() and 5 not in run()
    for only in ({"min_p": 0.05}, {"typical_p": 0.9}, {"top_p": 0.95}, {"top_p": 0.999999}):
        q = SamplingParams(temperature=0.8, seed=3, **only)
        assert len({sample(logits, q, make_rng(3)) for _ in range(3)}) == 1


@pytest.mark.parametrize("kw,param", [
    ({"min_p": -0.1}, "min_p"), ({"min_p": 1.5}, "min_p"), ({"typical_p": 0}, "typical_p"),
    ({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "logit_bias"), ({"seed": 2**64}, "seed"), ({"seed": -(2**63) - 1}, "seed"),
])
def test_bad_values_name_their_param(kw: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        SamplingParams(**kw)
    assert e.value.param == param


def test_negative_seeds_are_distinct_generators() -> None:
    assert make_rng(-1).random() == make_rng(-1).random() != make_rng(1).random()
    assert make_rng(-1).random() == make_rng(2**64 - 1).random()   # the same 64 bits
    assert dataclasses.replace(SamplingParams(logit_bias={"3": 1}), seed=1).logit_bias == ((3, 1),)


@pytest.mark.parametrize("kw", [{"repetition_penalty": 5e-324}, {"temperature": 5e-324},
                                {"temperature": 5e-324, "top_p": 0.5}, {"temperature": 1e-300, "min_p": 0.1},
                                {"repetition_penalty": 5e-324, "temperature": 5e-324, "top_k": 3}])
def test_the_extremes_of_the_accepted_ranges_pick_a_token_not_nan(kw: dict) -> None:
    """Found by Schemathesis once the ranges were published (issue 45): repetition_penalty 5e-324 made
    a seen positive logit inf, and inf - inf a NaN probability (a 500). Near-zero temperatures and
    penalties now pick the top token."""
    logits = np.array([1.0, 5.0, -2.0, 4.0, 0.5] * 300, dtype=np.float32)
    logits[1] = 6.0
    params = SamplingParams(**kw)
    row = apply_penalties(logits.copy(), params, prompt_ids=[1], counts={})
    assert np.isfinite(row).all()
    assert sample(row, params, make_rng(0)) == 1


@pytest.mark.parametrize("kw", [{"repetition_penalty": 5e-324, "top_p": 5e-324}, {"repetition_penalty": 5e-324},
                                {"repetition_penalty": 10.0, "temperature": 5e-324, "min_p": 0.5}])
def test_a_masked_seen_token_stays_masked_under_any_penalty(kw: dict) -> None:
    """Schemathesis's one 500 after the ranges were published: min_tokens masks EOS to -inf, EOS is in
    the prompt (a seen token), and -inf x 5e-324 was NaN in float32 (the penalty rounds to 0 there):
    the cuts then kept no candidate (IndexError). The masked token stays -inf, nothing is NaN."""
    logits = np.array([1.0, 5.0, -2.0, 4.0, 0.5] * 300, dtype=np.float32)
    logits[1], logits[2] = 6.0, -np.inf                  # 2: masked (min_tokens' EOS), and seen
    params = SamplingParams(**kw)
    with np.errstate(all="raise"):                       # no warning either (they went to the server log)
        row = apply_penalties(logits.copy(), params, prompt_ids=[1, 2, 3], counts={4: 2})
    assert not np.isnan(row).any() and row[2] == -np.inf
    assert row[sample(row, params, make_rng(0))] == row.max()   # the top token (penalty 10 moves it)


def big_row() -> np.ndarray:
    """A vocabulary-sized row of large logits, as a model gives them: noise around 0, then a top token
    at 80.0 (id 123), 79.5 (id 7) and 79.0 (id 31000)."""
    row = np.random.default_rng(0).normal(0.0, 3.0, 32000).astype(np.float32)
    row[[123, 7, 31000]] = 80.0, 79.5, 79.0
    return row


@pytest.mark.parametrize("t", [1e-6, 1e-3, 1e-310, 5e-324])
@pytest.mark.parametrize("cuts", [{}, {"top_p": 0.9}, {"top_k": 40}, {"min_p": 0.05}, {"typical_p": 0.9}])
def test_a_tiny_temperature_is_greedy_and_quiet(t: float, cuts: dict) -> None:
    """At a temperature near 0 every other token's weight exp(-gap / t) is exactly 0 in float64 (the
    smallest gap here is 0.5: exp(-500) at 1e-3), so the draw is the argmax, whatever the seed. Below
    ~1e-308 the quotient -gap / t overflowed to -inf with a RuntimeWarning (exact, but in the log);
    now no floating-point warning at all."""
    row = big_row()
    params = SamplingParams(temperature=t, **cuts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            picks = {sample(row.copy(), params, make_rng(seed)) for seed in range(20)}
    assert picks == {int(np.argmax(row))} == {123}


def test_temperature_0_7_on_large_logits_draws_softmax_of_logits_over_t() -> None:
    """At 0.7 the top three (80, 79.5, 79) take softmax(x / 0.7) of the mass: 0.578, 0.283, 0.139;
    the noise around 0 has about e^-100 of it. Seeded: the same draws each run, and no warning."""
    row = big_row()
    x = row.astype(np.float64) / 0.7
    want = np.exp(x - x.max())
    want /= want.sum()
    rng, n = make_rng(11), 2000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picks = [sample(row.copy(), SamplingParams(temperature=0.7), rng) for _ in range(n)]
    assert all(0 <= p < row.size for p in picks)
    assert set(picks) <= {123, 7, 31000}
    got = np.bincount(picks, minlength=row.size) / n
    for tok in (123, 7, 31000):   # 4.5 standard deviations at n=2000
        assert abs(got[tok] - want[tok]) < 0.05, (tok, got[tok], want[tok])
