"""POST /v1/audio/transcriptions and /v1/audio/translations in OpenAI's shape (multipart form).

Parse and check the form (every field done or refused with a 400 naming it), decode the audio,
then run the Whisper loop (audio/whisper.py) in the audio queue (server/speech.py) and render the
segments: json, text, srt, vtt, verbose_json, or with ``stream=true`` server-sent
``transcript.text.delta`` events, one per segment, and a ``transcript.text.done``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile

from ortserve.audio.decode import Audio, decode
from ortserve.audio.formats import MEDIA_TYPES, RESPONSE_FORMATS, render
from ortserve.audio.tokens import LANGUAGES, NAMES
from ortserve.audio.whisper import Options, Transcript
from ortserve.errors import InvalidRequest, OrtServeError
from ortserve.server import published
from ortserve.server.speech import SpeechHolder, run_in, stream_thread
from ortserve.server.state import state_of

router = APIRouter()
FIELDS = {"file", "model", "language", "prompt", "response_format", "temperature", "timestamp_granularities[]",
          "timestamp_granularities", "stream"}
TRANSLATION_FIELDS = FIELDS - {"language", "timestamp_granularities[]", "timestamp_granularities"}
GRANULARITIES = ("segment", "word")
# the form parse() reads, published (openapi_extra); the audio itself is checked when decoded
_FORM: dict[str, Any] = {
    "file": published.FILE, "model": {"type": "string"}, "prompt": {"type": "string"},
    "response_format": {"enum": list(RESPONSE_FORMATS)}, "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "stream": {"enum": ["true", "false"]}}
_AUDIO = "audio/wav, audio/flac, audio/mpeg"  # decoded by content (audio/decode.py)
TRANSLATION_FORM = published.multipart(["file"], _AUDIO, **_FORM)
TRANSCRIPTION_FORM = published.multipart(["file"], _AUDIO, **_FORM, language={"enum": sorted({*LANGUAGES, *NAMES})},
                                         **{"timestamp_granularities[]": {"type": "array",
                                                                          "items": {"enum": list(GRANULARITIES)}}})


@dataclass
class AudioRequest:
    data: bytes
    model: str | None
    options: Options
    response_format: str
    stream: bool
    granularities: tuple[str, ...] = ()


def _one(form: Any, name: str) -> str | None:
    values = form.getlist(name)
    if len(values) > 1:
        raise InvalidRequest(f"'{name}' is given {len(values)} times", param=name)
    if values and not isinstance(values[0], str):
        raise InvalidRequest(f"'{name}' must be a form field, not a file", param=name)
    return values[0] if values else None


async def parse(request: Request, task: str) -> AudioRequest:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        await request.body()  # read first: an oversized body is the guard's 413, as on every route
        raise InvalidRequest("send the audio as multipart/form-data with a 'file' field", param="file")
    try:
        form = await request.form(max_files=1, max_fields=32)
    except Exception as exc:  # noqa: BLE001 - a broken multipart body: the request's fault, named
        raise InvalidRequest(f"the multipart body could not be read: {exc}", param="file") from None
    allowed = FIELDS if task == "transcribe" else TRANSLATION_FIELDS
    for key in form:
        if key not in allowed:
            raise InvalidRequest(f"Unrecognized request argument supplied: {key}", param=key,
                                 code="unknown_parameter")
    upload = form.get("file")
    if upload is None:
        raise InvalidRequest("'file' is required", param="file", code="missing_required_parameter")
    if not isinstance(upload, UploadFile):
        raise InvalidRequest("'file' must be an uploaded file (wav, flac or mp3)", param="file")
    fmt = _one(form, "response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise InvalidRequest(f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}", param="response_format")
    options = _options(form, task, fmt)
    grains = tuple(form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities"))
    return AudioRequest(await upload.read(), _one(form, "model"), options, fmt, _stream(form, fmt), grains)


def _options(form: Any, task: str, fmt: str) -> Options:
    language = _one(form, "language")
    if language is not None:
        language = NAMES.get(language.strip().lower(), language.strip().lower())
        if language not in LANGUAGES:
            raise InvalidRequest(f"'language' {language!r} is not an ISO-639-1 code Whisper knows (e.g. 'en')",
                                 param="language")
    raw_t = _one(form, "temperature")
    try:
        temperature = float(raw_t) if raw_t not in (None, "") else 0.0
    except ValueError:
        raise InvalidRequest("'temperature' must be a number from 0 to 1", param="temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise InvalidRequest("'temperature' must be from 0 to 1", param="temperature")
    grains = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    for g in grains:
        if g not in GRANULARITIES:
            raise InvalidRequest(f"'timestamp_granularities[]' values are {' and '.join(GRANULARITIES)}",
                                 param="timestamp_granularities[]")
    if grains and fmt != "verbose_json":
        raise InvalidRequest("'timestamp_granularities[]' needs response_format 'verbose_json'",
                             param="timestamp_granularities[]")
    return Options(task=task, language=language, prompt=_one(form, "prompt") or "", temperature=temperature,
                   words="word" in grains)


def _stream(form: Any, fmt: str) -> bool:
    raw = (_one(form, "stream") or "false").strip().lower()
    if raw not in ("true", "false"):
        raise InvalidRequest("'stream' must be true or false", param="stream")
    if raw == "true" and fmt not in ("json", "text"):
        raise InvalidRequest(f"'stream' gives text deltas; response_format {fmt!r} cannot be streamed "
                             "(use json or text)", param="stream")
    return raw == "true"


@router.post("/v1/audio/transcriptions", response_model=None, openapi_extra=TRANSCRIPTION_FORM)
async def transcriptions(request: Request) -> Response:
    return await _serve(request, "transcribe")


@router.post("/v1/audio/translations", response_model=None, openapi_extra=TRANSLATION_FORM)
async def translations(request: Request) -> Response:
    return await _serve(request, "translate")


async def _serve(request: Request, task: str) -> Response:
    st = state_of(request)
    holder: SpeechHolder = st.speech
    body = await parse(request, task)
    audio: Audio = await asyncio.to_thread(decode, body.data, max_seconds=st.settings.audio_max_seconds)
    holder.reserve()       # 429 here, before any response starts
    try:                   # the model loads in the audio threads (their lower priority is inherited)
        _, model = await run_in(holder.pool, lambda: holder.get(body.model))
        if body.options.language not in (None, "en") and not model.multilingual:
            raise InvalidRequest("this Whisper model is English-only", param="language")
    except BaseException:
        holder.release()
        raise
    found = Transcript()
    if body.stream:
        return StreamingResponse(_events(holder, model, audio, body, found), media_type="text/event-stream")
    try:
        async with holder.slot():
            t0 = time.perf_counter()
            await run_in(holder.pool, lambda: list(model.transcribe(audio, body.options, found)))
            holder.count(task, audio.seconds, time.perf_counter() - t0)
    finally:
        holder.release()
    out = render(found, body.response_format, task, {"type": "duration", "seconds": round(audio.seconds, 2)},
                 body.granularities)
    if isinstance(out, dict):
        return JSONResponse(out)
    return PlainTextResponse(out, media_type=MEDIA_TYPES[body.response_format])


async def _events(holder: SpeechHolder, model: Any, audio: Audio, body: AudioRequest,
                  found: Transcript) -> AsyncIterator[bytes]:
    try:
        async with holder.slot():
            t0 = time.perf_counter()
            async for seg in stream_thread(lambda: model.transcribe(audio, body.options, found), holder.pool):
                yield _sse({"type": "transcript.text.delta", "delta": seg.text})
            holder.count(body.options.task, audio.seconds, time.perf_counter() - t0)
        yield _sse({"type": "transcript.text.done", "text": found.text})
    except Exception as exc:  # noqa: BLE001 - after the headers went out: an error event, and the stream ends
        err = exc if isinstance(exc, OrtServeError) else OrtServeError(f"transcription failed: {exc}")
        yield _sse({"type": "error", "error": err.to_openai()["error"]})
    finally:
        holder.release()


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()
