"""Turn what a user typed (--model / GENAI_MODEL_DIR) into a model directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortserve.models.catalog import CATALOG, DEFAULT_MODEL
from ortserve.models.store import ModelStore


def looks_like_path(ref: str) -> bool:
    return ("/" in ref or "\\" in ref or ref.startswith((".", "~")) or ref.lower().endswith(".gguf")
            or Path(ref).is_dir())


def is_gguf_file(path: Path) -> bool:
    from ortserve.models.validate import has_gguf_magic

    try:
        return has_gguf_magic(path)
    except OSError:   # no such file, or a directory: not a GGUF
        return False


def resolve_model_dir(ref: str | None, settings: Any,
                      progress: Callable[[str], None] | None = None) -> tuple[Path, str]:
    """(model directory, model id). The default model is imported on first use, and so is a
    GGUF file, as ``llama-server -m FILE.gguf`` serves it (``gguf_model_id``)."""
    ref = ref or DEFAULT_MODEL
    if looks_like_path(ref):
        path = Path(ref).expanduser()
        if not is_gguf_file(path):
            return path, path.name  # loading it reports what is missing
        if settings is None:
            from ortserve.config import load_settings

            settings = load_settings()
        ref = gguf_model_id(ModelStore(settings.store_dir), path, progress)
    store = ModelStore(settings.store_dir)
    entry = CATALOG.get(ref) or next((e for e in CATALOG.values() if ref in e.aliases), None)
    if entry is not None and entry.id == DEFAULT_MODEL:
        from ortserve.models.importer import ensure_default, refresh_stale

        if not store.find(DEFAULT_MODEL):
            ensure_default(store, progress)
        for v in store.find(DEFAULT_MODEL):   # an exact import from an older importer: rebuilt once
            refresh_stale(store, v, progress)
        ref = DEFAULT_MODEL
    from ortserve.models import select

    device = getattr(settings, "device", "auto")
    res = select.resolve(store, ref, device)
    if device == "auto" and _wants_gpu_build(res, settings):
        res = _build_gpu_variant(store, ref, res, progress) or res
    return res.path, res.model_id  # "model:variant": responses name the variant that served them


def gguf_model_id(store: ModelStore, path: Path, progress: Callable[[str], None] | None = None) -> str:
    """The store id of a GGUF file, imported on first use (exactly, as `ortserve models import
    FILE` does); a file changed since, or an id another source holds, is an error saying what to do."""
    from ortserve.errors import StoreError
    from ortserve.models.importer import import_gguf
    from ortserve.models.variants import model_id_from_path

    src = path.resolve()
    mid = model_id_from_path(src)
    have = [v for v in store.find(mid) if v.model == mid]
    for v in have:
        if v.source != f"gguf:{src}":
            raise StoreError(f"model id {mid!r} (from {src.name}) is already installed from {v.source}",
                             param="model", hint=f"import the file under another id: `ortserve models import "
                                                 f"{src} --id NAME`, then serve NAME")
        if src.stat().st_mtime > v.created:
            raise StoreError(f"{src.name} changed after it was imported as {v.id}", param="model",
                             hint=f"`ortserve models rm {mid}`, then serve the file again to re-import it")
    if not have:   # minutes for a large file: said on a terminal, logged when piped
        import logging

        (progress or logging.getLogger("ortserve.models").info)(
            f"importing {src.name} as {mid} (once; `ortserve models list` shows it)")
        import_gguf(store, src, mid, progress=progress)
    return mid


def _wants_gpu_build(res: Any, settings: Any) -> bool:
    """auto found a GPU but only CPU variants of the model are installed."""
    return (res.variant is not None and res.device in ("cuda", "dml") and res.variant.device != res.device
            and bool(getattr(settings, "auto_build_gpu", True)))


def _build_gpu_variant(store: ModelStore, ref: str, res: Any, progress: Callable[[str], None] | None) -> Any:
    """Build the device's preferred variant from the model's recorded source; None if it cannot be."""
    import importlib.util
    import logging

    from ortserve.errors import OrtServeError
    from ortserve.models import select
    from ortserve.models.importer import convert_model

    log = logging.getLogger("ortserve.models")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        log.warning("auto found %s but %s has no %s variant, and the convert extra is not installed to build "
                    "one: serving %s (pip install 'ortserve[convert]', then restart)", res.device,
                    res.variant.model, res.device, res.variant.id)
        return None
    precision = select.PREFERRED_PRECISIONS[res.device][0]
    if progress:
        progress(f"auto found {res.device}: building {res.variant.model} {precision}-{res.device} (once)")
    try:
        convert_model(store, res.variant.model, precision=precision, device=res.device)
    except OrtServeError as exc:
        log.warning("could not build a %s variant of %s (%s); serving %s", res.device, res.variant.model,
                    exc.one_line(), res.variant.id)
        return None
    return select.resolve(store, ref, "auto")
