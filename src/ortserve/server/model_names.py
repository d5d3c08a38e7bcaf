"""What a request's model name means: the generic names that pick the server's model, a
catalog entry's aliases, and a store model found by name (the lookup the manager uses when a
request names a model that is not loaded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortserve.errors import InvalidRequest, NotFound, OrtServeError

GENERIC_NAMES = {"onnx-genai", "default", "local"}


def resolve_store_model(settings: Any, name: str, loaded: list[str]) -> tuple[Path, str]:
    """(directory, model id) of the chat model a request names, from the store; ``loaded`` (the
    models the server holds) goes into the 404 that a wrong name gets."""
    from ortserve.models import select
    from ortserve.models.locate import looks_like_path
    from ortserve.models.store import ModelStore

    served = ", ".join(loaded) or "none"
    if not name.strip():   # the store's resolver strips it to "", which is the current directory
        raise NotFound(f"The model {name!r} does not exist: the name is blank (loaded: {served})",
                       param="model", code="model_not_found")
    if looks_like_path(name):
        raise NotFound(f"The model '{name}' does not exist: requests name store models, not paths "
                       f"(loaded: {served})", param="model", code="model_not_found")
    try:
        res = select.resolve(ModelStore(settings.store_dir), name, getattr(settings, "device", "cpu"))
    except NotFound:
        raise NotFound(f"The model '{name}' does not exist in this server's store (loaded: {served}); "
                       f"see GET /v1/models", param="model", code="model_not_found") from None
    except OrtServeError as exc:
        raise InvalidRequest(exc.message, param="model", code="model_not_found") from None
    found = getattr(res.variant, "kind", None) or "chat"
    if found not in ("chat", "llm", "causal-lm"):
        raise InvalidRequest(f"'{name}' is a {found} model, not a chat model", param="model",
                             code="wrong_model_kind")
    return res.path, res.model_id


def catalog_aliases(model_id: str) -> set[str]:
    """The names a catalog entry also answers to (empty for a model not in the catalog)."""
    from ortserve.models.catalog import CATALOG

    base = model_id.partition(":")[0]
    entry = CATALOG.get(model_id) or CATALOG.get(base)
    return set(entry.aliases) | {entry.id} if entry is not None else set()

