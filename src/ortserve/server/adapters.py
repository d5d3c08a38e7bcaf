"""LoRA adapters in the server: which request names mean an adapter, and the engine view that
serves it (the base model's engine, its session and its KV budget, with the adapter set per row).

A request names an adapter by its id (``my-adapter``, as vLLM's ``--lora-modules`` names do), by
``my-adapter:lora``, or as ``BASE:ADAPTER`` where BASE is the base's id, its model name, or the
name a loaded model answers to (``tiny:my-adapter``). All adapters of a base are loaded with the
base; one imported later (or dropped by keep_alive) is added to the running engine before its
next request. An adapter no request has used for its keep_alive is dropped from the engine's
stacks (``AdapterKeeper``): the request's keep_alive when one named the adapter, else the base's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortserve.errors import InvalidRequest, ModelError, OrtServeError
from ortserve.server.model_names import GENERIC_NAMES
from ortserve.server.slots import parse_keep_alive

log = logging.getLogger("ortserve.manager")


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
    """The base engine (loaded on demand) as requests for adapter ``v`` see it; a request's
    keep_alive applies to the base and to the adapter (as Ollama's applies to the model)."""
    from ortserve.models.adapters import load_adapter

    engine = await manager.get(v.base, keep_alive=keep_alive)
    if v.model not in engine.adapter_names:  # imported after the base was loaded, or dropped since
        try:
            await engine.add_adapter_async(lambda: load_adapter(v))
        except ModelError as exc:
            raise InvalidRequest(exc.message, param="model", code="model_not_supported") from None
    manager.adapter_use.used(engine, v.model, parse_keep_alive(keep_alive), manager.clock())
    return engine.with_adapter(v.model, model_id=v.model, reload=lambda: load_adapter(v))


@dataclass
class _Use:
    last_used: float
    keep_alive: float | None = None  # the last request's that named it; None: the base's


class AdapterKeeper:
    """When each loaded adapter was last used, and its keep_alive; ``reap`` drops the idle ones.

    An adapter with a request queued or running is in use (its clock restarts), so it is never
    dropped under a request; one loaded with its base and never asked for expires like a used one.
    Entries are keyed by the engine object, so a reloaded base starts its adapters' clocks afresh."""

    def __init__(self) -> None:
        self.uses: dict[tuple[int, str], _Use] = {}

    def used(self, engine: Any, name: str, keep_alive: float | None, now: float) -> None:
        """A request named adapter ``name`` at ``now`` (the manager's clock, as ``reap`` reads it)."""
        use = self.uses.setdefault((id(engine), name), _Use(now))
        use.last_used = now
        if keep_alive is not None:
            use.keep_alive = keep_alive

    def _keep_alive(self, manager: Any, slot: Any, use: _Use) -> float:
        return use.keep_alive if use.keep_alive is not None else float(manager.keep_alive_of(slot))

    async def reap(self, manager: Any, now: float) -> bool:
        """Drop every adapter idle past its keep_alive (a rebind, no new session, its stacks rebuilt
        in a worker thread); True if any went."""
        dropped, live = False, set()
        for slot in list(manager.slots.values()):
            engine = slot.obj
            if engine is None or not getattr(engine, "adapter_names", None):
                continue
            busy = engine.adapters_in_use()
            for name in engine.adapter_names:
                live.add((id(engine), name))
                use = self.uses.setdefault((id(engine), name), _Use(now))
                if name in busy:
                    use.last_used = now
                    continue
                ka = self._keep_alive(manager, slot, use)
                rebuild = engine.begin_remove(name) if ka >= 0 and now - use.last_used >= ka else None
                if rebuild is not None:
                    await asyncio.to_thread(rebuild)
                    log.info("keep_alive %.0f s passed: dropping adapter %s of %s", ka, name, slot.id)
                    del self.uses[(id(engine), name)]
                    live.discard((id(engine), name))
                    dropped = True
        for key in set(self.uses) - live:  # their base was unloaded, or they were dropped
            del self.uses[key]
        return dropped

    def expires_in(self, manager: Any, slot: Any, now: float) -> dict[str, float | None]:
        """Seconds until each adapter of ``slot``'s engine is dropped (None: never, or in use)."""
        engine, out = slot.obj, {}
        names = getattr(engine, "adapter_names", None) or []
        busy = engine.adapters_in_use() if names else set()
        for name in names:
            use = self.uses.get((id(engine), name))
            ka = self._keep_alive(manager, slot, use) if use is not None else float(manager.keep_alive_of(slot))
            idle = now - use.last_used if use is not None else 0.0
            out[name] = None if ka < 0 or name in busy else round(max(0.0, ka - idle), 3)
        return out
