"""Turn what a user typed (--model / GENAI_MODEL_DIR) into a model directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortserve.models.catalog import CATALOG, DEFAULT_MODEL
from ortserve.models.store import ModelStore


def looks_like_path(ref: str) -> bool:
    return "/" in ref or "\\" in ref or ref.startswith((".", "~")) or Path(ref).is_dir()


def resolve_model_dir(ref: str | None, settings: Any,
                      progress: Callable[[str], None] | None = None) -> tuple[Path, str]:
    """(model directory, model id). The default model is imported on first use."""
    ref = ref or DEFAULT_MODEL
    if looks_like_path(ref):
        path = Path(ref).expanduser()
        return path, path.name  # loading it reports what is missing
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
    return res.path, res.variant.model if res.variant is not None else res.model_id


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
