"""Whisper's decoding rules, word error rate, response formats, audio checks and the audio queue:
pure functions, no model."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from ortserve.audio import rules
from ortserve.audio.decode import decode, sniff
from ortserve.audio.formats import clock, srt, vtt
from ortserve.audio.tokens import SpecialTokens
from ortserve.audio.wer import wer, word_errors
from ortserve.audio.whisper import Segment
from ortserve.errors import InvalidRequest, Overloaded

SP = SpecialTokens(eot=50257, sot=50258, sot_prev=50361, translate=50358, transcribe=50359, no_speech=50362,
                   no_timestamps=50363, timestamp_begin=50364, languages={"en": 50259}, vocab_size=51865,
                   suppress=(50258, 50358, 50359, 50361, 50362))
TB = SP.timestamp_begin


def flat() -> np.ndarray:
    return np.zeros(51865, dtype=np.float32)


def allowed(out: np.ndarray) -> set[str]:
    kinds = set()
    if np.isfinite(out[:SP.eot]).any():
        kinds.add("text")
    if np.isfinite(out[SP.eot]):
        kinds.add("eot")
    if np.isfinite(out[TB:]).any():
        kinds.add("timestamp")
    return kinds


def test_a_window_starts_with_an_early_timestamp() -> None:
    out = rules.mask(flat(), [], SP, True)
    assert allowed(out) == {"timestamp"}
    assert np.isfinite(out[TB + 50]) and not np.isfinite(out[TB + 51])   # at most 1.0 s


def test_timestamps_come_in_pairs_and_never_go_back() -> None:
    assert allowed(rules.mask(flat(), [TB + 10], SP, True)) == {"text", "eot"}   # after the opening one
    logits = flat()
    logits[TB:] = 5.0                                                          # timestamps likely
    out = rules.mask(logits, [TB + 10, 440, 1002], SP, True)
    assert allowed(out) == {"timestamp"}                                       # their mass beats text
    assert not np.isfinite(out[TB + 10]) and np.isfinite(out[TB + 11])          # later than the last
    likely_end = flat()
    likely_end[SP.eot] = 20.0
    closed = rules.mask(likely_end, [TB + 10, 440, TB + 40], SP, True)
    assert allowed(closed) == {"timestamp", "eot"}                              # open pair: a timestamp or the end
    assert not np.isfinite(closed[TB + 39]) and np.isfinite(closed[TB + 40])
    paired = rules.mask(flat(), [TB, 440, TB + 40, TB + 40], SP, True)
    assert "timestamp" not in allowed(paired)


def test_suppressed_and_blank_tokens() -> None:
    out = rules.mask(flat(), [TB], SP, True)
    assert not np.isfinite(out[list(SP.suppress)]).any() and not np.isfinite(out[SP.no_timestamps])
    assert not np.isfinite(rules.mask(flat(), [], SP, False)[[rules.BLANK, SP.eot]]).any()


def test_greedy_and_sampled_choice() -> None:
    logits = flat()
    logits[7] = 4.0
    assert rules.choose(logits, 0.0, np.random.default_rng(0))[0] == 7
    picks = {rules.choose(logits, 1.0, np.random.default_rng(s))[0] for s in range(40)}
    assert len(picks) > 1


def test_rules_decide_what_mask_then_choose_decide() -> None:
    """The decode loop's ``Rules.next`` (static masks built once) against ``choose(mask(...))`` on
    random logits through random token histories: the same token and log-probability every step,
    greedy and sampled (same seed), where the timestamp rules force, forbid or leave timestamps."""
    fast = rules.Rules(SP)
    gen = np.random.default_rng(7)
    forced = 0
    for case in range(60):
        sampled: list[int] = []
        temperature = 0.0 if case % 3 else 0.7
        r1, r2 = np.random.default_rng(case), np.random.default_rng(case)
        for _ in range(12):
            logits = gen.normal(0, 3, 51865).astype(np.float32)
            if case % 4 == 0:
                logits[TB:] += 4.0              # timestamps likely: their total beats the best text
            masked = rules.mask(logits, sampled, SP, True)
            forced += int(not np.isfinite(masked[:TB]).any())
            want = rules.choose(masked, temperature, r1)
            got = fast.next(logits, sampled, temperature, r2)
            assert got[0] == want[0] and got[1] == pytest.approx(want[1], abs=0, rel=0), (case, sampled)
            if want[0] == SP.eot:
                break
            sampled.append(want[0])
    assert forced > 10                          # the forced-timestamp branch was exercised


def test_compression_ratio_flags_loops() -> None:
    assert rules.compression_ratio("the same words again " * 20) > 2.4
    assert rules.compression_ratio("The quick brown fox jumps over the lazy dog.") < 2.4


def test_word_error_rate() -> None:
    assert word_errors("The cat sat.", "the cat sat") == (0, 3)
    assert word_errors("a b c d", "a x c") == (2, 4)
    assert wer(["a b", "c d"], ["a b", "c"]) == 0.25


def test_srt_and_vtt() -> None:
    segs = [Segment(0, 0, 0.0, 1.5, " one", [], 0.0, -0.1, 1.0, 0.01),
            Segment(1, 0, 3661.25, 3662.0, " two", [], 0.0, -0.1, 1.0, 0.01)]
    assert clock(3661.25, ",") == "01:01:01,250"
    assert srt(segs) == "1\n00:00:00,000 --> 00:00:01,500\none\n\n2\n01:01:01,250 --> 01:01:02,000\ntwo\n\n"
    assert vtt(segs).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\none\n\n")


def wav(seconds: float, rate: int = 22050, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * rate), dtype=np.float32), rate, format=fmt)
    return buf.getvalue()


def test_decode_resamples_and_refuses_bad_audio() -> None:
    a = decode(wav(2.0), max_seconds=10)
    assert a.format == "wav" and len(a.pcm) == 32000
    assert sniff(wav(0.1, fmt="FLAC")) == "flac" and sniff(b"OggS....") is None
    for bad, code in [(b"", "invalid_audio"), (b"%PDF-1.4", "invalid_audio_format"),
                      (wav(2.0)[:20000], "invalid_audio"), (wav(20.0, rate=8000), "audio_too_long")]:
        with pytest.raises(InvalidRequest) as e:
            decode(bad, max_seconds=10)
        assert e.value.param == "file" and e.value.code == code


def test_the_audio_queue_is_bounded() -> None:
    from ortserve.models.store import ModelStore
    from ortserve.server.speech import SpeechHolder

    holder = SpeechHolder(ModelStore("/nonexistent"), concurrency=1, queue=1)
    holder.reserve()
    holder.reserve()
    with pytest.raises(Overloaded):
        holder.reserve()
    holder.release()
    holder.reserve()        # a place freed is a place again
