"""Audio bytes -> 16 kHz mono float32, with the checks that make bad input a 400 naming ``file``.

Formats are recognized by their bytes (RIFF/WAVE, fLaC, an MP3 frame or ID3 tag), never by the
file name: anything else, a truncated file, an empty one or one past the length limit is an
``InvalidRequest`` on ``file``. libsndfile (the ``soundfile`` wheel) decodes all three.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

from ortserve.errors import InvalidRequest

RATE = 16000
FORMATS = ("wav", "flac", "mp3")


@dataclass
class Audio:
    pcm: np.ndarray      # float32, mono, RATE Hz
    format: str

    @property
    def seconds(self) -> float:
        return len(self.pcm) / RATE


def sniff(data: bytes) -> str | None:
    """'wav', 'flac', 'mp3' or None, from the first bytes."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def decode(data: bytes, *, max_seconds: float, param: str = "file") -> Audio:
    if not data:
        raise InvalidRequest(f"'{param}' is empty", param=param, code="invalid_audio")
    kind = sniff(data)
    if kind is None:
        raise InvalidRequest(f"'{param}' is not a supported audio file: send {', '.join(FORMATS)} "
                             "(recognized by content, not by name)", param=param, code="invalid_audio_format")
    import soundfile as sf

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, frames = f.samplerate, f.frames
            if rate <= 0:
                raise ValueError("no sample rate")
            if frames > 0 and frames / rate > max_seconds:
                raise _too_long(frames / rate, max_seconds, param)
            pcm = f.read(dtype="float32", always_2d=True)
    except InvalidRequest:
        raise
    except (RuntimeError, ValueError, TypeError, EOFError, sf.LibsndfileError) as exc:
        raise InvalidRequest(f"'{param}' could not be decoded as {kind}: {exc}", param=param,
                             code="invalid_audio") from None
    promised = _promised_frames(data, kind)
    if promised is not None and len(pcm) < promised:
        raise InvalidRequest(f"'{param}' is truncated: its header promises {promised} frames, "
                             f"it holds {len(pcm)}", param=param, code="invalid_audio")
    if len(pcm) == 0:
        raise InvalidRequest(f"'{param}' holds no audio samples", param=param, code="invalid_audio")
    if len(pcm) / rate > max_seconds:
        raise _too_long(len(pcm) / rate, max_seconds, param)
    mono = pcm.mean(axis=1, dtype=np.float32)
    if not np.isfinite(mono).all():
        raise InvalidRequest(f"'{param}' holds non-finite samples", param=param, code="invalid_audio")
    return Audio(resample(mono, rate), kind)


def _promised_frames(data: bytes, kind: str) -> int | None:
    """Frames the header declares (WAV's data chunk, FLAC's STREAMINFO), or None if it does not say."""
    if kind == "flac" and len(data) >= 26:
        total = int.from_bytes(data[21:26], "big") & ((1 << 36) - 1)
        return total or None
    if kind != "wav":
        return None
    off, block = 12, 0
    while off + 8 <= len(data):
        cid, size = data[off:off + 4], int.from_bytes(data[off + 4:off + 8], "little")
        if cid == b"fmt " and off + 22 <= len(data):
            block = int.from_bytes(data[off + 20:off + 22], "little")   # bytes per frame
        if cid == b"data":
            return size // block if block and size not in (0, 0xFFFFFFFF) else None
        off += 8 + size + (size & 1)
    return None


def _too_long(seconds: float, limit: float, param: str) -> InvalidRequest:
    return InvalidRequest(f"'{param}' is {seconds:.0f} s long; this server takes at most {limit:.0f} s "
                          "(ORTSERVE_AUDIO_MAX_SECONDS)", param=param, code="audio_too_long")


def resample(pcm: np.ndarray, rate: int) -> np.ndarray:
    if rate == RATE:
        return pcm.astype(np.float32, copy=False)
    from scipy.signal import resample_poly

    g = math.gcd(rate, RATE)
    return resample_poly(pcm, RATE // g, rate // g).astype(np.float32)


def wav_bytes(pcm: np.ndarray) -> bytes:
    """16-bit PCM WAV of 16 kHz mono samples (what og's audio processor reads)."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.clip(pcm, -1.0, 1.0), RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()
