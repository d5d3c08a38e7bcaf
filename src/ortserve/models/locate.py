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
    if entry is not None and entry.id == DEFAULT_MODEL and not store.find(DEFAULT_MODEL):
        from ortserve.models.importer import ensure_default

        ensure_default(store, progress)
        ref = DEFAULT_MODEL
    from ortserve.models import select

    res = select.resolve(store, ref, getattr(settings, "device", "auto"))
    return res.path, res.variant.model if res.variant is not None else res.model_id
