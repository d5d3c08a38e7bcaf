"""How the manager builds a chat engine: its KV cap when loaded on demand, its LoRA adapters
(server/adapters.py) and, for the model the server starts with, its draft model (``draft_model``,
docs/speculative.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ortserve.errors import ModelError, OrtServeError
from ortserve.server.adapters import adapters_for_dir
from ortserve.server.memory import MB, kv_cap_bytes


def load_chat_engine(settings: Any, model_dir: Path, model_id: str, *, capped: bool = True) -> Any:
    """An engine; on-demand ones (capped) get a KV cache cap equal to their planned share, so the
    budget holds. The pinned start model keeps the engine's own KV budget, and its draft model."""
    from ortserve.engine import AsyncEngine

    base = settings
    if capped and not int(getattr(settings, "kv_cache_mb", 0) or 0) and hasattr(settings, "model_copy"):
        cap_mb = max(1, math.ceil(kv_cap_bytes(settings, model_dir) / MB))
        settings = settings.model_copy(update={"kv_cache_mb": cap_mb})
    return AsyncEngine.load(model_dir, settings, model_id, adapters_for_dir(base, model_dir),
                            draft=None if capped else draft_of(base))


def draft_of(settings: Any) -> tuple[Path, str] | None:
    """(directory, id) of the ``draft_model`` setting, a store model or a directory; None when unset."""
    ref = getattr(settings, "draft_model", None)
    if not ref:
        return None
    from ortserve.models.locate import resolve_model_dir

    try:
        return resolve_model_dir(str(ref), settings)
    except OrtServeError as exc:
        raise ModelError(f"draft model {ref!r} (draft_model, ORTSERVE_DRAFT_MODEL, --draft-model): "
                         f"{exc.message}", hint="`ortserve models list` shows the installed models") from exc
