"""What a variant is called and how one is built from weights and measured: builder options,
variant names, model ids from paths, perplexity against the fp32 reference, decode speed.

``importer.py`` (one function per source kind: GGUF, Hugging Face dir, ONNX dir, catalog)
builds on these; ``ortserve.models.importer`` re-exports them under their old names.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortserve.errors import StoreError
from ortserve.models import convert
from ortserve.models.quality import perplexity
from ortserve.models.store import ModelStore, validate_name

Progress = Callable[[str], None]

ALGOS = ("default", "rtn", "k_quant")
_MIXED_ABBREV = {"last_matmul": "last", "mixed_layers": "mixed", "linear_attn": "linattn"}


# ---- names and options --------------------------------------------------------

def quant_options(block_size: int | None = None, algo: str | None = None, last_matmul: str | None = None,
                  accuracy_level: int | None = None, symmetric: bool | None = None) -> dict[str, Any]:
    """Builder --extra_options from the names users see (``--block-size``, ``--algo``, ...)."""
    if algo is not None and algo not in ALGOS:
        raise StoreError(f"unknown quantization algorithm {algo!r}", hint=f"choose {', '.join(ALGOS)}")
    if block_size is not None and block_size not in (16, 32, 64, 128, 256):
        raise StoreError(f"block size {block_size} is not supported", hint="choose 16, 32, 64, 128 or 256")
    if last_matmul is not None and last_matmul not in ("int4", "int8"):
        raise StoreError(f"--last-matmul {last_matmul!r} is not a quant type", hint="choose int8 or int4")
    opts: dict[str, Any] = {"block_size": block_size, "algo_config": algo, "accuracy_level": accuracy_level,
                            "is_symmetric": symmetric,
                            "matmul_mixed_precision": f"last_matmul:{last_matmul}" if last_matmul else None}
    return {k: v for k, v in opts.items() if v is not None}


def variant_name(precision: str, device: str, options: dict[str, Any] | None = None) -> str:
    """``int8-cpu``; non-default builder options are appended (``int4-cpu-k_quant-last8``)."""
    parts = [precision, device]
    o = options or {}
    if o.get("algo_config") not in (None, "default"):
        parts.append(str(o["algo_config"]))
    if o.get("block_size") not in (None, 32):
        parts.append(f"b{o['block_size']}")
    for pair in str(o.get("matmul_mixed_precision") or "").split(","):
        if ":" in pair:
            sel, qt = pair.split(":", 1)
            parts.append(_MIXED_ABBREV.get(sel, sel) + qt.removeprefix("int"))
    if o.get("accuracy_level") is not None:
        parts.append(f"acc{o['accuracy_level']}")
    if o.get("is_symmetric") is False:
        parts.append("asym")
    return validate_name("-".join(parts).lower(), "variant")


def model_id_from_path(path: Path) -> str:
    """A valid model id from a file or directory name (``SmolLM2-135M.Q4_1.gguf`` -> ``smollm2-135m.q4_1``)."""
    stem = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
    mid = re.sub(r"[^a-z0-9._-]+", "-", stem.lower())
    mid = re.sub(r"\.{2,}", ".", re.sub(r"-{2,}", "-", mid)).strip("-._")[:64].strip("-._")
    if not mid:
        raise StoreError(f"cannot derive a model id from {path.name!r}", hint="pass --id NAME")
    return validate_name(mid)


def genai_facts(model_dir: Path) -> dict[str, Any]:
    cfg = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]
    return {"architecture": cfg.get("type", ""), "context_length": int(cfg.get("context_length", 0))}


# ---- quality and speed --------------------------------------------------------

def measure(model_dir: Path, device: str, reference_ppl: float | None, speed: bool = True) -> dict[str, Any]:
    """Manifest fields ``quality`` (perplexity vs reference) and, on CPU with ``speed``, ``speed``."""
    out: dict[str, Any] = {}
    try:
        ppl = perplexity(model_dir)
    except Exception as exc:  # noqa: BLE001 - e.g. a CUDA-only graph CPU cannot run: record why
        out["quality"] = {"perplexity": None, "note": f"not measured on this machine: {exc}".splitlines()[0]}
    else:
        q: dict[str, Any] = {"perplexity": round(ppl["perplexity"], 4), "tokens": ppl["tokens"]}
        if reference_ppl:
            q["reference_perplexity"] = round(reference_ppl, 4)
            q["delta_pct"] = round(100 * (ppl["perplexity"] / reference_ppl - 1), 3)
        out["quality"] = q
    if device == "cpu" and speed:
        from ortserve.models.speed import decode_tps

        try:
            out["speed"] = decode_tps(model_dir)
        except Exception as exc:  # noqa: BLE001 - speed is informative; never fail an import on it
            out["speed"] = {"decode_tps": None, "note": str(exc).splitlines()[0]}
    return out


def build_variant_from_hf(hf_dir: Path, out: Path, precision: str, device: str,
                          options: dict[str, Any] | None, progress: Progress | None,
                          reference_ppl: float | None = None) -> dict[str, Any]:
    """Build one variant into ``out`` and measure its quality; returns manifest fields."""
    convert.build_onnx(hf_dir, out, precision=precision, device=device, options=options, progress=progress)
    fields: dict[str, Any] = {"precision": precision, "device": device, **genai_facts(out)}
    if progress:
        progress("measuring perplexity and speed")
    is_reference = precision == "fp32" and device == "cpu"
    fields.update(measure(out, device, reference_ppl))
    q = fields["quality"]
    if is_reference and reference_ppl is None and q.get("perplexity"):
        q.update(reference_perplexity=q["perplexity"], delta_pct=0.0)   # fp32 on CPU *is* the reference
    if options:
        fields["notes"] = {"builder_options": options}
    return fields


def reference_perplexity(hf_dir: Path, progress: Progress | None = None, work_dir: Path | None = None) -> float:
    """Perplexity of the fp32 build of ``hf_dir`` (built in a temp dir, then discarded).

    ``work_dir`` puts that temp dir next to the install (the store sweeps it after a crash).
    """
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ortserve-ref-", dir=work_dir) as tmp:
        out = Path(tmp) / "fp32"
        if progress:
            progress("building the fp32 reference")
        convert.build_onnx(hf_dir, out, precision="fp32", device="cpu", progress=progress)
        return float(perplexity(out)["perplexity"])


def known_reference(store: ModelStore, model: str) -> float | None:
    """The model's fp32 reference perplexity if any installed variant already measured it."""
    for v in store.find(model):
        if v.model != model:
            continue
        ref = v.quality.get("reference_perplexity")
        if ref:
            return float(ref)
    return None


def reference_for(store: ModelStore, model: str, hf: Path, precision: str, device: str,
                  progress: Progress | None, tmp: Path) -> float | None:
    """The reference perplexity a new build compares with: a known one, else the fp32 build's
    (measured beside ``tmp``; None when the build is itself fp32 on CPU)."""
    ref = known_reference(store, model)
    if ref is None and not (precision == "fp32" and device == "cpu"):
        work = tmp.with_name(tmp.name + ".ref")
        try:
            ref = reference_perplexity(hf, progress, work_dir=work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return ref
