"""A transcript in OpenAI's response formats: json, text, srt, vtt and verbose_json."""

from __future__ import annotations

from typing import Any

from ortserve.audio.whisper import Segment, Transcript

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json", "text": "text/plain",
               "srt": "application/x-subrip", "vtt": "text/vtt"}


def clock(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(segments: list[Segment]) -> str:
    return "".join(f"{i}\n{clock(s.start, ',')} --> {clock(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(segments, 1))


def vtt(segments: list[Segment]) -> str:
    return "WEBVTT\n\n" + "".join(f"{clock(s.start, '.')} --> {clock(s.end, '.')}\n{s.text.strip()}\n\n"
                                  for s in segments)


def render(t: Transcript, fmt: str, task: str, usage: dict[str, Any],
           granularities: tuple[str, ...] = ()) -> dict[str, Any] | str:
    """The body of a finished transcription in ``fmt`` (a dict for the JSON formats). verbose_json
    has ``segments`` unless only ``word`` granularity was asked, and ``words`` when it was (OpenAI's)."""
    if fmt == "text":
        return t.text + "\n"
    if fmt == "srt":
        return srt(t.segments)
    if fmt == "vtt":
        return vtt(t.segments)
    if fmt == "verbose_json":
        out: dict[str, Any] = {"task": task, "language": t.language, "duration": round(t.duration, 2),
                               "text": t.text}
        if "segment" in granularities or "word" not in granularities:
            out["segments"] = [s.to_json() for s in t.segments]
        if "word" in granularities:
            out["words"] = [w.to_json() for w in t.words]
        return {**out, "usage": usage}
    return {"text": t.text, "usage": usage}
