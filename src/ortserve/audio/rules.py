"""Whisper's decoding rules on one step's logits (openai/whisper decoding.py), as pure functions.

``mask`` applies, in order: the suppressed tokens, a blank or end at the first sampled token,
and the timestamp rules (timestamps come in pairs, never decrease, the first token is a
timestamp no later than ``max_initial``, and a timestamp is forced where their total probability
beats every text token). Nothing here holds model state: the decode loop passes the tokens so far.
"""

from __future__ import annotations

import numpy as np

from ortserve.audio.tokens import SpecialTokens

BLANK = 220          # " " in Whisper's byte-level BPE
MAX_INITIAL_TIMESTAMP = 1.0   # seconds: the first timestamp of a window is at most this


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x[np.isfinite(x)].max() if np.isfinite(x).any() else 0.0
    z = x - m
    return z - np.log(np.exp(z).sum())


def mask(logits: np.ndarray, sampled: list[int], sp: SpecialTokens, timestamps: bool) -> np.ndarray:
    """The logits with every token Whisper would not emit next set to -inf (a copy)."""
    out = logits.astype(np.float32, copy=True)
    out[list(sp.suppress)] = -np.inf
    out[sp.vocab_size:] = -np.inf
    if not sampled:
        out[[BLANK, sp.eot]] = -np.inf
    if not timestamps:
        out[sp.timestamp_begin:] = -np.inf
        return out
    out[sp.no_timestamps] = -np.inf
    tb = sp.timestamp_begin
    last_ts = len(sampled) >= 1 and sampled[-1] >= tb
    penult_ts = len(sampled) < 2 or sampled[-2] >= tb
    if last_ts:
        if penult_ts:
            out[tb:] = -np.inf          # a pair is closed: text (or the end) comes next
        else:
            out[:sp.eot] = -np.inf      # an open timestamp: another timestamp or the end
    stamps = [t for t in sampled if t >= tb]
    if stamps:
        floor = stamps[-1] if last_ts and not penult_ts else stamps[-1] + 1
        out[tb:floor] = -np.inf          # timestamps never go back
    if not sampled:
        out[:tb] = -np.inf               # a window starts with a timestamp
        out[tb + int(MAX_INITIAL_TIMESTAMP / 0.02) + 1:] = -np.inf
    lp = log_softmax(out)
    text_best = lp[:tb].max() if np.isfinite(lp[:tb]).any() else -np.inf
    ts_total = np.logaddexp.reduce(lp[tb:][np.isfinite(lp[tb:])]) if np.isfinite(lp[tb:]).any() else -np.inf
    if ts_total > text_best:
        out[:tb] = -np.inf
    return out


def choose(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> tuple[int, float]:
    """The next token (greedy at temperature 0, else sampled) and its log-probability."""
    lp = log_softmax(logits)
    if temperature <= 0:
        token = int(np.argmax(logits))
    else:
        p = np.exp(log_softmax(logits / temperature))
        token = int(rng.choice(len(p), p=p / p.sum()))
    return token, float(lp[token])


def compression_ratio(text: str) -> float:
    """Whisper's repetition measure: text bytes over their zlib size (loops compress well)."""
    import zlib

    raw = text.encode("utf-8")
    return len(raw) / max(1, len(zlib.compress(raw)))
