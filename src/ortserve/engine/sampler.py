"""Token selection for one sequence from its logits row (numpy, per request).

Each request has its own random generator (seeded by ``seed``), so its output does not
depend on what else is in the batch.
"""

from __future__ import annotations

import numpy as np

from ortserve.types import SamplingParams

_CANDIDATES = 1024  # top-p is computed over the most likely tokens first; full sort only if needed


def make_rng(seed: int | None) -> np.random.Generator:
    """A sequence's generator. Negative seeds (int64, as some clients send) are taken modulo 2**64,
    so every seed in [-2**63, 2**64) is valid and distinct int64 seeds stay distinct."""
    return np.random.default_rng(None if seed is None else seed & (2**64 - 1))


def apply_penalties(logits: np.ndarray, params: SamplingParams, prompt_ids: list[int],
                    counts: dict[int, int]) -> np.ndarray:
    if params.repetition_penalty != 1.0:
        seen = np.fromiter(set(prompt_ids) | counts.keys(), dtype=np.int64)
        if seen.size:
            vals = logits[seen]
            logits[seen] = np.where(vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty)
    if counts and (params.presence_penalty or params.frequency_penalty):
        ids = np.fromiter(counts.keys(), dtype=np.int64)
        freq = np.fromiter(counts.values(), dtype=np.float32)
        logits[ids] -= params.presence_penalty + params.frequency_penalty * freq
    return logits


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    if params.greedy:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / params.temperature
    k = params.top_k if params.top_k and params.top_k < x.size else 0
    if k == 0 and params.top_p >= 1.0:
        p = np.exp(x - x.max())
        return int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right").clip(0, x.size - 1))
    n = k or min(_CANDIDATES, x.size)
    idx = np.argpartition(-x, n - 1)[:n]
    idx = idx[np.argsort(-x[idx], kind="stable")]
    p = np.exp(x[idx] - x[idx[0]])
    if k == 0 and n < x.size:
        total = np.exp(x - x[idx[0]]).sum()
        if p.sum() / total < params.top_p:  # the nucleus is wider than the candidates: use all
            idx = np.argsort(-x, kind="stable")
            p = np.exp(x[idx] - x[idx[0]])
    p /= p.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), params.top_p, side="left")) + 1
        p = p[:keep] / p[:keep].sum()
        idx = idx[:keep]
    return int(idx[rng.choice(len(p), p=p)])


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
