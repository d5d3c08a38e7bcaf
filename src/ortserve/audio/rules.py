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


class Rules:
    """``choose(mask(...))`` for the decode loop, with the masks that never change built once.

    Same arithmetic as ``mask`` then ``choose`` (the same ``log_softmax``, the same reductions, in
    the same order), so the same token and log-probability; only the per-step work that does not
    depend on the step (the suppressed ids, the ids past the vocabulary) is hoisted out of the loop,
    and the log-softmax ``choose`` needs is the one ``mask`` computed when no rule changed the logits
    after it. ``tests/unit/test_audio_rules.py`` checks both give the same decisions.
    """

    def __init__(self, sp: SpecialTokens) -> None:
        self.sp = sp
        self.static: np.ndarray | None = None   # True where always -inf (built at the first step's size)

    def _static(self, n: int) -> np.ndarray:
        if self.static is None or len(self.static) != n:
            static = np.zeros(n, dtype=bool)
            static[list(self.sp.suppress)] = True
            static[self.sp.vocab_size:] = True
            static[self.sp.no_timestamps] = True
            self.static = static
        return self.static

    def next(self, logits: np.ndarray, sampled: list[int], temperature: float,
             rng: np.random.Generator) -> tuple[int, float]:
        sp, tb = self.sp, self.sp.timestamp_begin
        out = logits.astype(np.float32, copy=True)
        out[self._static(len(out))] = -np.inf
        if not sampled:
            out[[BLANK, sp.eot]] = -np.inf
        last_ts = len(sampled) >= 1 and sampled[-1] >= tb
        penult_ts = len(sampled) < 2 or sampled[-2] >= tb
        if last_ts:
            if penult_ts:
                out[tb:] = -np.inf
            else:
                out[:sp.eot] = -np.inf
        last = next((t for t in reversed(sampled) if t >= tb), None)
        if last is not None:
            out[tb:last if last_ts and not penult_ts else last + 1] = -np.inf
        if not sampled:
            out[:tb] = -np.inf
            out[tb + int(MAX_INITIAL_TIMESTAMP / 0.02) + 1:] = -np.inf
        lp = log_softmax(out)
        text, stamps = lp[:tb], lp[tb:]
        finite = np.isfinite(stamps)
        text_best = text.max() if np.isfinite(text).any() else -np.inf
        ts_total = np.logaddexp.reduce(stamps[finite]) if finite.any() else -np.inf
        if ts_total > text_best:
            out[:tb] = -np.inf
            lp = log_softmax(out)
        if temperature <= 0:
            token = int(np.argmax(out))
        else:
            p = np.exp(log_softmax(out / temperature))
            token = int(rng.choice(len(p), p=p / p.sum()))
        return token, float(lp[token])
