"""`ortserve transcribe FILE`: speech to text on this machine, without a server (docs/audio.md)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ortserve.cli.common import guarded, settings_from


@click.command("transcribe")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--model", default=None, help="A Whisper model in the store (default: ORTSERVE_AUDIO_MODEL, whisper-base)")
@click.option("--language", default=None, help="The spoken language's code (en, de, ...); detected when absent")
@click.option("--translate", is_flag=True, help="Translate to English instead of transcribing")
@click.option("--prompt", default="", help="Text that comes before the audio (names, spelling)")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "verbose_json", "srt", "vtt"]), default="text",
              show_default=True, help="Output format; text prints each segment as it is decoded")
@click.option("--temperature", type=click.FloatRange(0, 1), default=0.0, show_default=True)
@click.option("--words", is_flag=True, help="Word timestamps (verbose_json's 'words'; needs --format verbose_json)")
@guarded
def transcribe_command(file: Path, model: str | None, language: str | None, translate: bool, prompt: str,
                       fmt: str, temperature: float, words: bool) -> None:
    """Transcribe (or translate) a WAV, FLAC or MP3 file with Whisper."""
    from ortserve.audio.decode import decode
    from ortserve.audio.formats import render
    from ortserve.audio.whisper import Options, Transcript
    from ortserve.models.store import ModelStore
    from ortserve.server.speech import SpeechHolder

    if words and fmt != "verbose_json":
        raise click.UsageError("--words needs --format verbose_json")
    s = settings_from()
    _, whisper = SpeechHolder(ModelStore(s.store_dir), s.audio_model, threads=s.audio_threads).get(model)
    audio = decode(file.read_bytes(), max_seconds=s.audio_max_seconds)
    task = "translate" if translate else "transcribe"
    found = Transcript()
    t0 = time.perf_counter()
    for seg in whisper.transcribe(audio, Options(task=task, language=language, prompt=prompt,
                                                 temperature=temperature, words=words), found):
        if fmt == "text":
            click.echo(seg.text.strip())
    spent = time.perf_counter() - t0
    if fmt != "text":
        out = render(found, fmt, task, {"type": "duration", "seconds": round(audio.seconds, 2)},
                     ("segment", "word") if words else ())
        click.echo(json.dumps(out, indent=2) if isinstance(out, dict) else out, nl=False)
    print(f"{audio.seconds:.1f} s of audio in {spent:.1f} s (real-time factor {spent / audio.seconds:.3f})",
          file=sys.stderr)
