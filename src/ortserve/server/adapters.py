"""LoRA adapters in the server: which request names mean an adapter, and the engine view that
serves it (the base model's engine, its session and its KV budget, with the adapter set per row).

A request names an adapter by its id (``my-adapter``, as vLLM's ``--lora-modules`` names do), by
``my-adapter:lora``, or as ``BASE:ADAPTER`` where BASE is the base's id, its model name, or the
name a loaded model answers to (``tiny:my-adapter``). All adapters of a base are loaded with the
base; one imported later is added to the running engine before its first request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortserve.errors import InvalidRequest, ModelError, OrtServeError
from ortserve.server.model_names import GENERIC_NAMES


def _store(settings: Any) -> Any:
    from ortserve.models.store import ModelStore

    store_dir = getattr(settings, "store_dir", None)
    return ModelStore(store_dir) if store_dir is not None else None


def store_adapters(settings: Any) -> list[Any]:
    """The installed adapters: only ``*--lora`` directories' manifests are read (this runs for
    every request naming a model the manager does not know yet)."""
    import json

    from ortserve.models.store import MANIFEST, Variant

    store = _store(settings)
    if store is None or not store.root.is_dir():
        return []
    out = []
    for d in store.root.glob("*--lora"):
        try:
            v = Variant.from_json(json.loads((d / MANIFEST).read_text(encoding="utf-8")), d)
        except (OSError, ValueError, TypeError):
            continue  # being installed, or damaged: not an adapter to serve
        if v.kind == "adapter":
            out.append(v)
    return sorted(out, key=lambda v: v.model)


def adapters_for_dir(settings: Any, model_dir: Path) -> list[Any]:
    """The engine-side adapters (engine/lora.py) of every installed adapter whose base is ``model_dir``."""
    from ortserve.models.adapters import load_adapter

    store, want, out = _store(settings), Path(model_dir).resolve(), []
    for v in store_adapters(settings):
        try:
            if Path(store.get(v.base).model_dir).resolve() == want:
                out.append(load_adapter(v))
        except (OrtServeError, OSError, ValueError, KeyError):
            continue  # its base is gone, or its files are damaged: the base still serves
    return out


def find_adapter(manager: Any, name: str | None) -> Any:
    """The installed adapter a request's model name means, or None when it names something else."""
    if not name or name in manager.slots or name in manager.aliases or name.lower() in GENERIC_NAMES:
        return None
    adapters = store_adapters(manager.settings)
    for v in adapters:
        if name in (v.model, v.id) or name in v.aliases:
            return v
    prefix, sep, tail = name.rpartition(":")
    for v in adapters:
        if sep and tail == v.model and _is_base(manager, prefix, v):
            return v
    return None


def _is_base(manager: Any, prefix: str, v: Any) -> bool:
    if prefix in (v.base, v.base.partition(":")[0]):
        return True
    slot = manager.slots.get(manager.aliases.get(prefix, prefix))
    if slot is None:
        return False
    try:
        return bool(Path(slot.dir).resolve() == Path(_store(manager.settings).get(v.base).model_dir).resolve())
    except OrtServeError:
        return False


async def adapter_engine(manager: Any, v: Any, keep_alive: Any) -> Any:
    """The base engine (loaded on demand) as requests for adapter ``v`` see it."""
    engine = await manager.get(v.base, keep_alive=keep_alive)
    if v.model not in engine.adapter_names:  # imported after the base was loaded
        from ortserve.models.adapters import load_adapter

        try:
            engine.add_adapter(load_adapter(v))
        except ModelError as exc:
            raise InvalidRequest(exc.message, param="model", code="model_not_supported") from None
    return engine.with_adapter(v.model, model_id=v.model)
