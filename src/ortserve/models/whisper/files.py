"""The small files beside a Whisper model that the builder, og and Hugging Face tools read.

A faster-whisper directory has ``tokenizer.json`` and ``config.json`` (CTranslate2's, with
language and suppression ids) but no ``tokenizer_config.json``, ``preprocessor_config.json`` or
``generation_config.json``; the ONNX GenAI builder needs the first (AutoTokenizer), og's
tokenizer reads ``tokenizer.json`` with it, and faster-whisper/transformers read the others.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

SPECIALS = "<|endoftext|>"


def tokenizer_config() -> dict[str, Any]:
    return {"tokenizer_class": "WhisperTokenizer", "bos_token": SPECIALS, "eos_token": SPECIALS,
            "unk_token": SPECIALS, "pad_token": SPECIALS, "model_max_length": 1024,
            "add_prefix_space": False, "errors": "replace", "clean_up_tokenization_spaces": True}


def preprocessor_config(n_mels: int) -> dict[str, Any]:
    return {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": n_mels, "sampling_rate": 16000,
            "hop_length": 160, "chunk_length": 30, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000,
            "padding_side": "right", "padding_value": 0.0, "return_attention_mask": False,
            "processor_class": "WhisperProcessor"}


def generation_config(config: dict[str, Any]) -> dict[str, Any]:
    return {"decoder_start_token_id": config["decoder_start_token_id"], "bos_token_id": config["bos_token_id"],
            "eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"],
            "begin_suppress_tokens": config.get("begin_suppress_tokens", []),
            "suppress_tokens": config.get("suppress_tokens", []),
            "max_length": config.get("max_target_positions", 448), "is_multilingual": config.get("is_multilingual")}


def write_hf_side_files(src: Path, out: Path, config: dict[str, Any]) -> None:
    """Copy the tokenizer (and CTranslate2's vocabulary) and write the configs that are missing."""
    for name in ("tokenizer.json", "vocabulary.json", "vocab.json", "merges.txt", "added_tokens.json",
                 "special_tokens_map.json", "normalizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        if (src / name).is_file() and not (out / name).is_file():
            shutil.copy2(src / name, out / name)
    fill_missing(out, config)


def fill_missing(out: Path, config: dict[str, Any]) -> None:
    """Write tokenizer_config.json, preprocessor_config.json, generation_config.json where absent."""
    files = {"tokenizer_config.json": tokenizer_config(),
             "preprocessor_config.json": preprocessor_config(int(config.get("num_mel_bins", 80))),
             "generation_config.json": generation_config(config)}
    for name, body in files.items():
        if not (out / name).is_file():
            (out / name).write_text(json.dumps(body, indent=2), encoding="utf-8")
