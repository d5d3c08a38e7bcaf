"""Token selection for one sequence from its logits row (numpy, per request).

Each request has its own random generator (seeded by ``seed``), so its output does not
depend on what else is in the batch.
"""

from __future__ import annotations

import math

import numpy as np

from ortserve.types import SamplingParams

_CANDIDATES = 1024  # top-p is computed over the most likely tokens first; full sort only if needed
_BIG = float(np.finfo(np.float32).max)


def make_rng(seed: int | None) -> np.random.Generator:
    """A sequence's generator. Negative seeds (int64, as some clients send) are taken modulo 2**64,
    so every seed in [-2**63, 2**64) is valid and distinct int64 seeds stay distinct."""
    return np.random.default_rng(None if seed is None else seed & (2**64 - 1))


def apply_penalties(logits: np.ndarray, params: SamplingParams, prompt_ids: list[int],
                    counts: dict[int, int]) -> np.ndarray:
    """Repetition/presence/frequency penalties, then logit_bias, in place (the caller copies the
    row when ``params.edits_logits``). A bias of -100 bans its token outright."""
    if params.repetition_penalty != 1.0:
        seen = np.fromiter(set(prompt_ids) | counts.keys(), dtype=np.int64)
        if seen.size:
            # in float64, where a penalty near 0 (5e-324 is in range) is not 0 as in float32 (then a
            # token masked to -inf, min_tokens' EOS, times 0 was NaN); clipped above, where a positive
            # logit over it would be inf and then inf - inf a NaN; -inf (a masked token) stays -inf
            vals = logits[seen].astype(np.float64)
            with np.errstate(over="ignore", divide="ignore", under="ignore"):
                logits[seen] = np.minimum(np.where(vals > 0, vals / params.repetition_penalty,
                                                   vals * params.repetition_penalty), _BIG)
    if counts and (params.presence_penalty or params.frequency_penalty):
        ids = np.fromiter(counts.keys(), dtype=np.int64)
        freq = np.fromiter(counts.values(), dtype=np.float32)
        logits[ids] -= params.presence_penalty + params.frequency_penalty * freq
    if params.logit_bias:
        ids, vals, banned = params.bias_arrays
        logits[ids] += vals
        logits[banned] = -np.inf
    return logits


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Temperature, then the cuts in vLLM's order (min_p, top_k, top_p, typical_p), then a draw.

    Greedy (temperature 0 or top_k 1) is one argmax and pays for none of the cuts. With min_p
    on (the server defaults) only its survivors, usually a handful, are sorted and exponentiated.
    """
    if params.greedy:
        return int(np.argmax(logits))
    t = params.temperature
    k = params.top_k if params.top_k and params.top_k < logits.size else 0
    if k == 0 and params.top_p >= 1.0 and params.min_p == 0 and params.typical_p >= 1.0:
        x = logits.astype(np.float64)
        p = _weights(x, x.max(), t)
        return int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right").clip(0, x.size - 1))
    idx, total = _candidates(logits, k, params)
    x = logits[idx].astype(np.float64)
    p = _weights(x, x[0], t)         # idx[0] is the most likely token: p[0] == 1
    if total == 0.0:                 # the candidates are the whole distribution (after min_p / top_k)
        total = float(p.sum())
    if params.top_p < 1.0:           # the nucleus, as a share of what min_p and top_k left
        keep = int(np.searchsorted(np.cumsum(p) / total, params.top_p, side="left")) + 1
        p, idx = p[:keep], idx[:keep]
    p = p / p.sum()
    if params.typical_p < 1.0:
        p, idx = _typical(p, idx, params.typical_p)
    return int(idx[rng.choice(len(p), p=p)])


def greedy_unless(logits: np.ndarray, suppressed: set[int] | tuple[()]) -> int | None:
    """The greedy pick of a row that nothing edits, without copying it: its first maximum, which is
    also the first maximum of the row with the ``suppressed`` tokens set to -inf unless it is one of
    them (then None: the caller masks the row and picks again)."""
    token = int(np.argmax(logits))
    return None if token in suppressed else token


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple[int, float, list[tuple[int, float]]]:
    """The model's log-probability of ``token`` and of the ``top`` likeliest tokens (raw logits,
    before penalties, grammar and temperature, as OpenAI and vLLM report them)."""
    x = logits.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    alts: list[tuple[int, float]] = []
    if top > 0:
        idx = np.argpartition(-x, top - 1)[:top]
        idx = idx[np.argsort(-x[idx], kind="stable")]
        alts = [(int(i), float(x[i] - lse)) for i in idx]
    return token, float(x[token] - lse), alts


def _weights(x: np.ndarray, top: float, t: float) -> np.ndarray:
    """exp((x - top) / t) in float64 for logits ``x`` <= ``top``: each token's probability relative to
    the most likely one (1.0 at it). The max is subtracted before dividing, so a tiny temperature gives
    0s, not inf - inf; a temperature so small that the quotient overflows (5e-324: -80 / 5e-324) gives
    -inf there, whose weight is exactly 0 as in the limit: neither that overflow nor exp's underflow
    to 0 is an error (numpy warns of the first by default)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp((x - top) / t)


def _candidates(logits: np.ndarray, k: int, params: SamplingParams) -> tuple[np.ndarray, float]:
    """Token ids sorted most likely first, after min_p and top_k, holding every token top_p and
    typical_p can keep; and the mass top_p is measured against (0.0: the candidates' own)."""
    if params.min_p > 0:             # p / p_max >= min_p  <=>  logit >= max + T log(min_p)
        top = float(logits.max())
        idx = np.flatnonzero(logits >= top + params.temperature * math.log(params.min_p))
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        return (idx[:k] if k else idx), 0.0
    if k:
        idx = np.argpartition(logits, logits.size - k)[-k:]
        return idx[np.argsort(-logits[idx], kind="stable")], 0.0
    x, t = logits.astype(np.float64), params.temperature   # order only: the temperature scales the gaps
    top = float(x.max())
    total = float(_weights(x, top, t).sum())
    if params.top_p < 1.0 and x.size > _CANDIDATES:
        idx = np.argpartition(x, x.size - _CANDIDATES)[-_CANDIDATES:]
        idx = idx[np.argsort(-x[idx], kind="stable")]
        if _weights(x[idx], top, t).sum() / total >= params.top_p:
            return idx, total
    return np.argsort(-x, kind="stable"), total  # the nucleus is wider than the candidates, or typical_p only


def _typical(p: np.ndarray, idx: np.ndarray, mass: float) -> tuple[np.ndarray, np.ndarray]:
    """Locally typical sampling as Hugging Face's TypicalLogitsWarper does it: keep the tokens whose
    surprisal is closest to the entropy, until their mass reaches ``mass`` (at least one token)."""
    logp = np.log(np.clip(p, 1e-300, None))
    entropy = -float((p * logp).sum())
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    cum = np.cumsum(p[order])
    last = min(int(np.count_nonzero(cum < mass)), len(p) - 1)
    keep = order[:last + 1]
    q = p[keep]
    return q / q.sum(), idx[keep]
