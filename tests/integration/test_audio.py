"""/v1/audio/transcriptions and /translations on a real server with a tiny Whisper built at test
time (random encoder; its decoder says " hello world" in every 30 s window, in Whisper's token
protocol), through ortserve's own import; the real openai client, streamed and not."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from tests.audio_material import SAYS, import_tiny_whisper
from tests.servers import ServerThread

from ortserve.models.store import ModelStore

RATE = 16000


def tone(seconds: float, fmt: str = "WAV", rate: int = RATE) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 440 * t), rate, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("audio-home")
    import_tiny_whisper(ModelStore(home / "models"), tmp_path_factory.mktemp("audio-work"))
    with ServerThread(tiny_model, home=str(home), audio_model="tiny-whisper", audio_max_seconds=100) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def post(server: ServerThread, data: bytes | None, route: str = "transcriptions", name: str = "a.wav",
         **fields: object) -> httpx.Response:
    files = {"file": (name, data, "application/octet-stream")} if data is not None else None
    return httpx.post(f"{server.url}/v1/audio/{route}", files=files,
                      data={"model": "whisper-1", **{k: str(v) for k, v in fields.items()}}, timeout=120)


def test_openai_client_transcribes(client: openai.OpenAI) -> None:
    out = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", tone(3.0)))
    assert out.text == SAYS.strip()


def test_verbose_json_segments_language_and_usage(client: openai.OpenAI) -> None:
    out = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", tone(3.0)),
                                             response_format="verbose_json", timestamp_granularities=["segment"])
    assert out.language == "english" and out.duration == pytest.approx(3.0, abs=0.01)
    (seg,) = out.segments
    assert (seg.start, seg.end, seg.text.strip()) == (0.0, 1.0, SAYS.strip())
    assert seg.avg_logprob > -1.0 and 0.0 <= seg.no_speech_prob < 0.6 and seg.temperature == 0.0


def test_word_timestamps_in_verbose_json(client: openai.OpenAI) -> None:
    """The tiny Whisper's attention is random, so only the shape is checked here (real timing:
    test_whisper_base.py): OpenAI's top-level words, in order, inside their segment, and no
    segments when only words are asked."""
    out = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", tone(3.0)),
                                             response_format="verbose_json", timestamp_granularities=["word"])
    assert [w.word for w in out.words] == SAYS.split() and out.segments is None
    starts = [w.start for w in out.words]
    assert starts == sorted(starts) and all(0.0 <= w.start <= w.end <= 1.0 for w in out.words)
    both = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", tone(3.0)),
                                              response_format="verbose_json",
                                              timestamp_granularities=["word", "segment"])
    assert len(both.segments) == 1 and [w.word for w in both.words] == SAYS.split()


def test_streamed_deltas_then_done(client: openai.OpenAI) -> None:
    events = list(client.audio.transcriptions.create(model="whisper-1", file=("a.wav", tone(65.0)), stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas == [SAYS] * 3          # one segment per 30 s window, in order
    assert events[-1].type == "transcript.text.done"
    assert events[-1].text == " ".join([SAYS.strip()] * 3)


def test_long_audio_windows_in_order(server: ServerThread) -> None:
    body = post(server, tone(65.0), response_format="verbose_json").json()
    assert [(s["start"], s["end"]) for s in body["segments"]] == [(0.0, 1.0), (30.0, 31.0), (60.0, 61.0)]
    assert [s["id"] for s in body["segments"]] == [0, 1, 2]


@pytest.mark.parametrize("fmt", ["FLAC", "MP3"])
def test_flac_and_mp3(server: ServerThread, fmt: str) -> None:
    r = post(server, tone(2.0, fmt, rate=22050), name=f"a.{fmt.lower()}")
    assert r.status_code == 200 and r.json()["text"] == SAYS.strip()


def test_text_srt_vtt(server: ServerThread) -> None:
    assert post(server, tone(2.0), response_format="text").text == SAYS.strip() + "\n"
    assert post(server, tone(2.0), response_format="srt").text == \
        f"1\n00:00:00,000 --> 00:00:01,000\n{SAYS.strip()}\n\n"
    vtt = post(server, tone(2.0), response_format="vtt")
    assert vtt.headers["content-type"].startswith("text/vtt")
    assert vtt.text == f"WEBVTT\n\n00:00:00.000 --> 00:00:01.000\n{SAYS.strip()}\n\n"


def test_translation_route(client: openai.OpenAI, server: ServerThread) -> None:
    out = client.audio.translations.create(model="whisper-1", file=("a.wav", tone(2.0)))
    assert out.text == SAYS.strip()
    r = post(server, tone(2.0), route="translations", language="de")
    assert r.status_code == 400 and r.json()["error"]["param"] == "language"


def _half(data: bytes) -> bytes:
    return data[: len(data) // 2]


@pytest.mark.parametrize(("data", "fields", "param"), [
    (b"", {}, "file"),                                          # empty
    (b"hello, this is not audio" * 10, {}, "file"),             # wrong type
    (None, {}, "file"),                                          # missing
    (b"RIFF\x00\x00\x00\x00WAVEjunk", {}, "file"),              # a header and nothing else
    ("truncated", {}, "file"),                                   # a WAV cut in half
    ("long", {}, "file"),                                        # past audio_max_seconds (100)
    ("ok", {"response_format": "xml"}, "response_format"),
    ("ok", {"language": "klingon"}, "language"),
    ("ok", {"temperature": "hot"}, "temperature"),
    ("ok", {"temperature": "1.5"}, "temperature"),
    ("ok", {"timestamp_granularities[]": "letter", "response_format": "verbose_json"}, "timestamp_granularities[]"),
    ("ok", {"timestamp_granularities[]": "segment"}, "timestamp_granularities[]"),   # needs verbose_json
    ("ok", {"stream": "true", "response_format": "srt"}, "stream"),
    ("ok", {"stream": "maybe"}, "stream"),
    ("ok", {"include[]": "logprobs"}, "include[]"),               # not done: refused, never ignored
    ("ok", {"model": "no-such-model"}, "model"),
])
def test_bad_requests_name_the_field(server: ServerThread, data: object, fields: dict[str, str], param: str) -> None:
    named = {"truncated": _half(tone(4.0)), "long": tone(120.0), "ok": tone(1.0)}
    body = named[data] if isinstance(data, str) else data
    r = post(server, body, **fields)  # type: ignore[arg-type]
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param
    # the server keeps serving, audio and chat
    assert post(server, tone(1.0)).json()["text"] == SAYS.strip()


def test_chat_model_is_not_an_audio_model(server: ServerThread) -> None:
    r = post(server, tone(1.0), model="tiny")
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == "model"
    chat = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                 "max_tokens": 4}, timeout=60)
    assert chat.status_code == 200


def test_metrics_count_audio_seconds(server: ServerThread) -> None:
    before = _audio_seconds(server)
    post(server, tone(2.5))
    assert _audio_seconds(server) == pytest.approx(before + 2.5, abs=0.01)


def _audio_seconds(server: ServerThread) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    lines = [ln for ln in text.splitlines() if ln.startswith('ortserve_audio_seconds_total{task="transcribe"}')]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_manifest_kind_and_models_list(server: ServerThread) -> None:
    v = ModelStore(server.settings.store_dir).find("tiny-whisper")[0]
    assert v.kind == "audio" and v.architecture == "whisper" and v.precision == "fp32"
    assert v.quality["wer"] is None or v.quality["wer"] >= 0.5    # measured: random weights hear nothing
    assert v.notes["source_format"] == "huggingface"
    assert json.loads((v.path / "genai_config.json").read_text())["model"]["type"] == "whisper"


def test_cli_transcribe(server: ServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from ortserve.cli.main import cli

    wav = tmp_path / "a.wav"
    wav.write_bytes(tone(65.0))
    monkeypatch.setenv("ORTSERVE_HOME", str(server.settings.home))
    text = CliRunner().invoke(cli, ["transcribe", str(wav), "--model", "tiny-whisper"])
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines() == [SAYS.strip()] * 3
    srt = CliRunner().invoke(cli, ["transcribe", str(wav), "--model", "tiny-whisper", "--format", "srt"])
    assert srt.stdout.startswith(f"1\n00:00:00,000 --> 00:00:01,000\n{SAYS.strip()}\n\n2\n00:00:30,000")
    timed = CliRunner().invoke(cli, ["transcribe", str(wav), "--model", "tiny-whisper", "--format", "verbose_json",
                                     "--words"])
    body = json.loads(timed.stdout)
    assert [w["word"] for w in body["words"]] == SAYS.split() * 3 and len(body["segments"]) == 3
    assert CliRunner().invoke(cli, ["transcribe", str(wav), "--words"]).exit_code == 2      # needs verbose_json
    missing = CliRunner().invoke(cli, ["transcribe", str(wav), "--model", "no-such-model"])
    assert missing.exit_code != 0 and "no-such-model" in missing.output
