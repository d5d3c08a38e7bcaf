"""What the engine reads from a model folder's genai_config.json (``ModelSpec``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortserve.errors import ModelError


@dataclass(frozen=True)
class ModelSpec:
    """What the runner needs from genai_config.json."""

    onnx_path: Path
    layers: int
    kv_heads: int
    heads: int
    head_size: int
    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int
    session_options: dict[str, Any]

    @classmethod
    def read(cls, model_dir: Path) -> ModelSpec:
        cfg_path = model_dir / "genai_config.json"
        if not cfg_path.is_file():
            raise ModelError(f"{model_dir} has no genai_config.json",
                             hint="point --model at an ONNX GenAI model directory, or import one with "
                                  "`ortserve models import`")
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            m = cfg["model"]
            dec = m["decoder"]
            eos = m.get("eos_token_id", [])
            eos_ids = tuple(eos) if isinstance(eos, list) else (int(eos),)
            spec = cls(onnx_path=model_dir / dec.get("filename", "model.onnx"),
                       layers=int(dec["num_hidden_layers"]), kv_heads=int(dec["num_key_value_heads"]),
                       heads=int(dec.get("num_attention_heads", dec["num_key_value_heads"])),
                       head_size=int(dec["head_size"]), vocab_size=int(m["vocab_size"]),
                       context_length=int(m.get("context_length") or cfg["search"]["max_length"]),
                       eos_token_ids=eos_ids, bos_token_id=m.get("bos_token_id"),
                       pad_token_id=int(m.get("pad_token_id", eos_ids[0] if eos_ids else 0)),
                       session_options=dec.get("session_options", {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{cfg_path} is not a valid genai_config.json: missing or bad {exc}") from exc
        if not spec.onnx_path.is_file():
            raise ModelError(f"{model_dir} has no {spec.onnx_path.name} (named in genai_config.json)",
                             hint="re-export or re-import the model")
        return spec
