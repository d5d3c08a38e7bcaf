"""A model's own sampling defaults: read at import (generation_config.json, or a GGUF's
``general.sampling.*`` metadata), kept in the manifest under ``sampling``, applied by the server
to the fields a request leaves unset (server defaults fill the rest; see types.SamplingDefaults).
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

from ortserve.types import SAMPLING_DEFAULT_FIELDS, SamplingDefaults

log = logging.getLogger("ortserve.models")

# generation_config.json keys that mean exactly what ours mean (HF's repetition_penalty covers the
# whole context, as ours does).
_HF_KEYS = {name: name for name in SAMPLING_DEFAULT_FIELDS}
# GGUF keys (llama.cpp's gguf-py Keys.General.SAMPLING_*) that map exactly; penalty_repeat does
# not (llama.cpp applies it to the last penalty_last_n tokens only), so it is left out.
_GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
              "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p"}


def _clean(values: dict[str, Any]) -> dict[str, float | int]:
    """Keep the values SamplingParams accepts; a model file with a silly value is not fatal."""
    out: dict[str, float | int] = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        value = int(value) if name == "top_k" else float(value)
        try:
            SamplingDefaults(values={name: value})
        except Exception:  # noqa: BLE001 - out of range: ignore the model's value, log why
            log.warning("ignoring the model's sampling default %s=%r (out of range)", name, value)
            continue
        out[name] = value
    return out


def from_generation_config(path: Path) -> dict[str, float | int]:
    """The sampling fields of a Hugging Face generation_config.json ({} when absent or unreadable)."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    return _clean({ours: cfg[theirs] for theirs, ours in _HF_KEYS.items() if theirs in cfg})


def from_gguf(path: Path) -> dict[str, float | int]:
    """The sampling metadata a GGUF file carries ({} when it has none)."""
    try:
        from ortserve.models.gguf.opening import open_reader

        reader = open_reader(path)
    except Exception:  # noqa: BLE001 - no metadata is not an error
        return {}
    found: dict[str, Any] = {}
    for key, ours in _GGUF_KEYS.items():
        f = reader.fields.get(key)
        if f is not None and f.data:
            found[ours] = f.parts[f.data[0]][0].item()
    return _clean(found)


def for_source(source: Path) -> dict[str, float | int]:
    """What an import records: a GGUF's metadata, or a HF/ONNX directory's generation_config.json."""
    source = Path(source)
    if source.is_file() and source.suffix.lower() == ".gguf":
        return from_gguf(source)
    return from_generation_config(source / "generation_config.json")


def model_sampling(model_dir: Path) -> tuple[dict[str, float | int], str]:
    """The model's own defaults and where they came from: the manifest's ``sampling`` (recorded
    at import), else a generation_config.json in the directory (stores made before that)."""
    model_dir = Path(model_dir)
    try:
        manifest = json.loads((model_dir / "ortserve.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    if isinstance(manifest, dict) and isinstance(manifest.get("sampling"), dict):
        return _clean(manifest["sampling"]), "model manifest"
    found = from_generation_config(model_dir / "generation_config.json")
    return found, "generation_config.json" if found else ""


@lru_cache(maxsize=32)
def _cached(model_dir: str, server: tuple[tuple[str, float | int], ...], use_model: bool) -> SamplingDefaults:
    model, source = model_sampling(Path(model_dir)) if use_model else ({}, "")
    return SamplingDefaults.layered(dict(server), model, source)


def defaults_for(settings: Any, model_dir: Path | str | None) -> SamplingDefaults:
    """Server defaults from settings, overlaid with the model's own where it has them."""
    server = tuple((name, getattr(settings, f"default_{name}")) for name in SAMPLING_DEFAULT_FIELDS)
    return _cached(str(model_dir or ""), server, bool(settings.model_sampling_defaults and model_dir))
