"""Bringing models into the store: GGUF files (and, via the store CLI, HF and ONNX dirs)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from ortserve.models import convert
from ortserve.models.catalog import DEFAULT_MODEL, DEFAULT_PRECISION, embedded_gguf
from ortserve.models.quality import perplexity
from ortserve.models.store import ModelStore, Variant

Progress = Callable[[str], None]


def variant_name(precision: str, device: str) -> str:
    return f"{precision}-{device}"


def genai_facts(model_dir: Path) -> dict[str, Any]:
    cfg = json.loads((model_dir / "genai_config.json").read_text())["model"]
    return {"architecture": cfg.get("type", ""), "context_length": int(cfg.get("context_length", 0))}


def build_variant_from_hf(hf_dir: Path, out: Path, precision: str, device: str,
                          options: dict[str, Any] | None, progress: Progress | None,
                          reference_ppl: float | None = None) -> dict[str, Any]:
    """Build one variant into ``out`` and measure its quality; returns manifest fields."""
    convert.build_onnx(hf_dir, out, precision=precision, device=device, options=options, progress=progress)
    fields: dict[str, Any] = {"precision": precision, "device": device, **genai_facts(out)}
    if device == "cpu":
        ppl = perplexity(out)
        q: dict[str, Any] = {"perplexity": round(ppl["perplexity"], 4), "tokens": ppl["tokens"]}
        if reference_ppl:
            q["reference_perplexity"] = round(reference_ppl, 4)
            q["delta_pct"] = round(100 * (ppl["perplexity"] / reference_ppl - 1), 3)
        fields["quality"] = q
    if options:
        fields["notes"] = {"builder_options": options}
    return fields


def reference_perplexity(hf_dir: Path, progress: Progress | None = None) -> float:
    """Perplexity of the fp32 build of ``hf_dir`` (built in a temp dir, then discarded)."""
    with tempfile.TemporaryDirectory(prefix="ortserve-ref-") as tmp:
        out = Path(tmp) / "fp32"
        convert.build_onnx(hf_dir, out, precision="fp32", device="cpu", progress=progress)
        return float(perplexity(out)["perplexity"])


def import_gguf(store: ModelStore, gguf: Path, model_id: str, *, precision: str = DEFAULT_PRECISION,
                device: str = "cpu", options: dict[str, Any] | None = None,
                progress: Progress | None = None, aliases: list[str] | None = None) -> Variant:
    """GGUF -> (dequantized) HF weights -> ONNX GenAI variant, installed atomically."""

    def build(tmp: Path) -> dict[str, Any]:
        work = tmp.with_name(tmp.name + ".hf")
        work.mkdir()
        try:
            hf = convert.gguf_to_hf(gguf, work / "hf", progress)
            ref = reference_perplexity(hf, progress) if device == "cpu" else None
            fields = build_variant_from_hf(hf, tmp, precision, device, options, progress, ref)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return {**fields, "source": f"gguf:{gguf.name}", "aliases": aliases or []}

    return store.install(model_id, variant_name(precision, device), build)


def ensure_default(store: ModelStore, progress: Progress | None = None) -> Variant:
    """The embedded default model, imported on first use and reused afterwards."""
    hits = [v for v in store.find(DEFAULT_MODEL) if v.device == "cpu"]
    preferred = [v for v in hits if v.precision == DEFAULT_PRECISION]
    if preferred or hits:
        return (preferred or hits)[0]
    return import_gguf(store, embedded_gguf(), DEFAULT_MODEL, precision=DEFAULT_PRECISION,
                       progress=progress, aliases=["default"])
