"""Which models are loaded: load on demand, keep_alive, a memory budget, LRU eviction.

One ModelManager per server. A request names a model (any store model, or the pinned one
the server started with); the manager hands back its started engine, loading it first if
needed. Concurrent first requests share one load; a request waits at most ``load_wait``
seconds, then gets 503 with Retry-After. Loaded models count against one memory budget
(their planned size: weight files plus the KV cache of ``max_batch`` short sequences);
when a new one does not fit, idle unpinned models go, least recently used first. A model
larger than the whole budget gets 507 naming the numbers.

It manages anything with ``async start()``, ``async stop()`` and ``stats()`` or ``busy()``: chat engines
(LoRA adapters ride on their base's, server/adapters.py), embedding models (:meth:`register_kind`).
Idle time is read from ``clock`` (monotonic seconds; tests set a manual one to expire keep_alive).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortserve.errors import InvalidRequest, NotFound, OrtServeError, Unavailable
from ortserve.server.adapters import AdapterKeeper, adapter_engine, find_adapter
from ortserve.server.engine_loader import load_chat_engine
from ortserve.server.memory import (
    MB,
    Estimator,
    InsufficientMemory,
    chat_estimate,
    default_budget,
    kv_cap_bytes,
    rss_bytes,
    weights_bytes,
)
from ortserve.server.model_names import GENERIC_NAMES, catalog_aliases, resolve_store_model
from ortserve.server.ps import draft_of_engine, ps_rows
from ortserve.server.slots import External, Slot, parse_keep_alive

# the names other modules and tests import from here
__all__ = ["GENERIC_NAMES", "MB", "Estimator", "InsufficientMemory", "Loader", "ModelManager", "Slot",
           "chat_estimate", "default_budget", "kv_cap_bytes", "parse_keep_alive", "weights_bytes"]

log = logging.getLogger("ortserve.manager")
Loader = Callable[[Path, str], Any]          # (model dir, model id) -> an unstarted managed object (sync)


class ModelManager:
    def __init__(self, settings: Any, *, budget_bytes: int | None = None,
                 resolve: Callable[[str], tuple[Path, str]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock                          # what keep_alive and LRU idle time are read from
        self.budget = budget_bytes if budget_bytes is not None else default_budget(settings)
        self.slots: dict[str, Slot] = {}
        self.aliases: dict[str, str] = {}           # names a request used -> slot id
        self.default_id: str | None = None
        self.kinds: dict[str, tuple[Loader, Estimator]] = {}
        self._resolve = resolve or self._resolve_store
        self._admit = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_change: list[Callable[[], None]] = []
        self.loads_total: dict[str, int] = {}      # model id -> loads since start (reloads count)
        self.adapter_use = AdapterKeeper()         # LoRA adapters' own keep_alive (server/adapters.py)
        self.register_kind("chat", self._load_engine, chat_estimate(settings))

    # ---- configuration ---------------------------------------------------------------
    def register_kind(self, kind: str, loader: Loader, estimate: Estimator) -> None:
        """A kind of model: ``loader(dir, id)`` builds it (in a thread), ``estimate(dir)`` sizes it."""
        self.kinds[kind] = (loader, estimate)

    def _load_engine(self, model_dir: Path, model_id: str, capped: bool = True) -> Any:
        """An engine (server/engine_loader.py): capped on demand, the pinned one with its draft model."""
        return load_chat_engine(self.settings, model_dir, model_id, capped=capped)

    @property
    def keep_alive_default(self) -> float:
        return float(getattr(self.settings, "keep_alive", 300.0))

    @property
    def load_wait(self) -> float:
        return float(getattr(self.settings, "load_wait", 60.0))

    # ---- the pinned model the server started with ---------------------------------------
    async def adopt(self, obj: Any, model_dir: Path | str, model_id: str, *, kind: str = "chat",
                    pinned: bool = True) -> Slot:
        """An already loaded (unstarted or started) object; the server's start model."""
        await obj.start()
        slot = Slot(id=model_id, kind=kind, dir=Path(model_dir), planned_bytes=self._estimate(kind, model_dir),
                    pinned=pinned, obj=obj, loaded_at=time.time(), loads=1, last_used=self.clock())
        self._measure(slot)
        self.slots[model_id] = slot
        if pinned and kind == "chat" and self.default_id is None:
            self.default_id = model_id
        self._changed()
        return slot

    async def preload(self, model_dir: Path, model_id: str, *, kind: str = "chat") -> Any:
        """Load and pin the start model (it is never evicted nor unloaded by keep_alive)."""
        if kind == "chat":
            self.default_id = model_id
        slot = Slot(id=model_id, kind=kind, dir=Path(model_dir), planned_bytes=self._estimate(kind, model_dir),
                    pinned=True, last_used=self.clock())
        self.slots[model_id] = slot
        slot.task = asyncio.ensure_future(self._load(slot))
        return await asyncio.shield(slot.task)

    # ---- what requests call -----------------------------------------------------------
    async def get(self, name: str | None, *, kind: str = "chat", keep_alive: Any = None) -> Any:
        """The started object for ``name``: loaded on first use, waited for while loading."""
        if kind == "chat" and (adapter := find_adapter(self, name)) is not None:  # LoRA: the base's engine
            return await adapter_engine(self, adapter, keep_alive)
        slot = await self.slot_for(name, kind=kind)
        if slot.kind != kind:  # e.g. an embedding model's id on a chat route
            where = "/v1/embeddings" if slot.kind == "embedding" else "the chat routes"
            raise InvalidRequest(f"'{name}' is a {slot.kind} model, not a {kind} model; it is served on {where}",
                                 param="model", code="model_not_supported")
        ka = parse_keep_alive(keep_alive)
        if ka is not None and not slot.pinned:
            slot.keep_alive = ka
        obj = await self._ready(slot)
        slot.requests += 1
        slot.last_used = self.clock()
        return obj

    async def slot_for(self, name: str | None, *, kind: str = "chat") -> Slot:
        sid = self.id_for(name, kind)
        slot = self.slots.get(sid)
        if slot is not None:
            return slot
        model_dir, sid2 = self._resolve_dir(name or "", sid)
        same = self._slot_of_dir(model_dir)
        if same is not None:  # e.g. "model:variant" of the model the server started with
            self.aliases[name or ""] = same.id
            return same
        async with self._admit:
            slot = self.slots.get(sid2)
            if slot is None:
                slot = Slot(id=sid2, kind=kind, dir=model_dir, planned_bytes=self._estimate(kind, model_dir),
                            last_used=self.clock())
                await self._make_room(slot)
                self.slots[sid2] = slot
                slot.task = asyncio.ensure_future(self._load(slot))
                self._changed()
        return slot

    def id_for(self, name: str | None, kind: str = "chat") -> str:
        """The slot id a request's model name means (without loading anything)."""
        if kind == "chat" and (name is None or name.lower() in GENERIC_NAMES) and self.default_id:
            return self.default_id
        if name is None:
            raise InvalidRequest("'model' is required", param="model", code="missing_required_parameter")
        if name in self.slots:
            return name
        if name in self.aliases:
            return self.aliases[name]
        default = self.slots.get(self.default_id or "")
        if kind == "chat" and default is not None and name in catalog_aliases(default.id):
            return default.id
        return name

    def _slot_of_dir(self, model_dir: Path) -> Slot | None:
        want = Path(model_dir).resolve()
        return next((s for s in self.slots.values() if s.dir.resolve() == want), None)

    def _resolve_dir(self, name: str, sid: str) -> tuple[Path, str]:
        if sid in self.slots:
            return self.slots[sid].dir, sid
        model_dir, model_id = self._resolve(name)
        self.aliases[name] = model_id
        return model_dir, model_id

    def _resolve_store(self, name: str) -> tuple[Path, str]:
        return resolve_store_model(self.settings, name, loaded=sorted(self.slots))

    def _estimate(self, kind: str, model_dir: Path | str) -> int:
        if kind not in self.kinds:
            raise InvalidRequest(f"unknown model kind {kind!r}", param="model")
        try:
            return int(self.kinds[kind][1](Path(model_dir)))
        except OSError:
            return 0

    async def _ready(self, slot: Slot) -> Any:
        if slot.obj is not None:
            return slot.obj
        task = slot.task
        if task is None:  # unloaded between lookup and here: load again
            return await self.get(slot.id, kind=slot.kind)
        started = time.monotonic()
        slot.waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout=self.load_wait)
        except TimeoutError:
            waited = time.monotonic() - started
            raise Unavailable(f"model '{slot.id}' is still loading after {waited:.0f} s; retry shortly",
                              code="model_loading").with_retry_after(5) from None
        finally:
            slot.waiters -= 1

    async def _load(self, slot: Slot) -> Any:
        loader, _ = self.kinds[slot.kind]
        if loader == self._load_engine and slot.pinned:
            loader = functools.partial(self._load_engine, capped=False)
        before = rss_bytes()
        t0 = time.monotonic()
        try:
            obj = await asyncio.to_thread(loader, slot.dir, slot.id)
            await obj.start()
        except OrtServeError as exc:
            self._forget(slot, exc.one_line())
            raise
        except Exception as exc:
            self._forget(slot, f"{type(exc).__name__}: {exc}")
            raise Unavailable(f"model '{slot.id}' failed to load: {type(exc).__name__}: {exc}",
                              code="model_load_failed") from exc
        slot.obj, slot.loaded_at, slot.task = obj, time.time(), None
        self._measure(slot)
        slot.rss_delta = max(0, rss_bytes() - before)
        slot.loads += 1
        self.loads_total[slot.id] = self.loads_total.get(slot.id, 0) + 1
        slot.last_used = self.clock()
        log.info("loaded %s (%s) in %.1f s, planned %.0f MB", slot.id, slot.kind, time.monotonic() - t0,
                 slot.planned_bytes / MB)
        self._changed()
        return obj

    def _measure(self, slot: Slot) -> None:
        """Once loaded, an engine's real KV cap replaces the estimate (the pinned model's may be larger)."""
        kv = getattr(slot.obj, "kv_budget", None)  # the draft model's KV row is inside it
        if isinstance(kv, int) and kv > 0:
            draft = draft_of_engine(slot.obj)
            slot.planned_bytes = weights_bytes(slot.dir) + kv + (weights_bytes(draft.dir) if draft else 0)

    def _forget(self, slot: Slot, error: str) -> None:
        slot.error = error
        if self.slots.get(slot.id) is slot:
            del self.slots[slot.id]
        log.error("model %s failed to load: %s", slot.id, error)
        self._changed()

    # ---- models another part loads (the embedding holder) ------------------------------
    def adopt_external(self, model_id: str, kind: str, model_dir: Path | str, nbytes: int,
                       close: Callable[[], None]) -> None:
        """A model loaded outside the manager (the embedding holder, from a worker thread): it
        shows in ps and /metrics, counts against the budget, obeys keep_alive and can be evicted
        or unloaded (``close`` drops it). Over budget, idle unpinned models make room."""
        slot = Slot(id=model_id, kind=kind, dir=Path(model_dir), planned_bytes=int(nbytes),
                    obj=External(close), loaded_at=time.time(), loads=1, last_used=self.clock())
        self.slots[model_id] = slot
        self.loads_total[model_id] = self.loads_total.get(model_id, 0) + 1
        if self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._fit(slot)))

    def touch(self, model_id: str) -> None:
        """A request used an adopted model (thread-safe: plain attribute writes)."""
        slot = self.slots.get(model_id)
        if slot is not None:
            slot.requests += 1
            slot.last_used = self.clock()

    async def _fit(self, newcomer: Slot) -> None:
        while self.used_bytes() > self.budget:
            victim = self._lru_victim(exclude=newcomer)
            if victim is None:
                log.warning("over the memory budget (%.0f of %.0f MB) with nothing idle to evict",
                            self.used_bytes() / MB, self.budget / MB)
                return
            log.info("evicting %s to make room for %s", victim.id, newcomer.id)
            await self._unload(victim)

    # ---- the budget -------------------------------------------------------------------
    def used_bytes(self) -> int:
        return sum(s.planned_bytes for s in self.slots.values())

    async def _make_room(self, slot: Slot) -> None:
        need = slot.planned_bytes
        pinned = sum(s.planned_bytes for s in self.slots.values() if s.pinned)
        if need + pinned > self.budget:
            pins = ", ".join(f"{s.id} {s.planned_bytes / MB:.0f} MB" for s in self.slots.values() if s.pinned)
            raise InsufficientMemory(
                f"model '{slot.id}' needs {need / MB:.0f} MB but the memory budget is {self.budget / MB:.0f} MB"
                + (f" with {pinned / MB:.0f} MB held by pinned models ({pins})" if pinned else "")
                + "; raise ORTSERVE_MEMORY_BUDGET_MB or use a smaller variant", param="model")
        deadline = time.monotonic() + self.load_wait
        while self.used_bytes() + need > self.budget:
            victim = self._lru_victim()
            if victim is not None:
                log.info("evicting %s (idle %.0f s) to make room for %s", victim.id,
                         self.clock() - victim.last_used, slot.id)
                await self._unload(victim)
                continue
            if time.monotonic() >= deadline:
                busy = ", ".join(s.id for s in self.slots.values() if not s.pinned)
                raise Unavailable(
                    f"no room for '{slot.id}' ({need / MB:.0f} MB): {self.used_bytes() / MB:.0f} of "
                    f"{self.budget / MB:.0f} MB are held by busy or pinned models ({busy}); retry shortly",
                    code="memory_budget_full").with_retry_after(5)
            await asyncio.sleep(0.1)

    def _lru_victim(self, exclude: Slot | None = None) -> Slot | None:
        idle = [s for s in self.slots.values()
                if not s.pinned and s.obj is not None and not s.busy() and s is not exclude]
        return min(idle, key=lambda s: s.last_used) if idle else None

    # ---- unloading --------------------------------------------------------------------
    async def unload(self, name: str) -> Slot:
        """Unload now (admin). Pinned models cannot be; busy ones finish their requests first."""
        sid = self.id_for(name)
        slot = self.slots.get(sid)
        if slot is None:
            raise NotFound(f"model '{name}' is not loaded", param="model", code="model_not_loaded")
        if slot.pinned:
            raise InvalidRequest(f"model '{sid}' is pinned (the model the server started with); "
                                 "it stays loaded", param="model", code="model_pinned")
        if slot.task is not None:
            await asyncio.shield(slot.task)
        await self._unload(slot)
        return slot

    async def _unload(self, slot: Slot) -> None:
        if self.slots.get(slot.id) is slot:
            del self.slots[slot.id]
        obj, slot.obj = slot.obj, None
        if obj is not None:
            await obj.stop()
        log.info("unloaded %s", slot.id)
        self._changed()

    def keep_alive_of(self, slot: Slot) -> float:
        return slot.keep_alive if slot.keep_alive is not None else self.keep_alive_default

    async def reap_once(self) -> None:
        now = self.clock()
        for slot in list(self.slots.values()):
            if slot.pinned or slot.obj is None:
                continue
            if slot.busy():
                slot.last_used = now
                continue
            ka = self.keep_alive_of(slot)
            if ka >= 0 and now - slot.last_used >= ka:
                log.info("keep_alive %.0f s passed: unloading %s", ka, slot.id)
                await self._unload(slot)
        if await self.adapter_use.reap(self, now):
            self._changed()

    async def _reap_forever(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            try:
                await self.reap_once()
            except Exception:  # the reaper must outlive one bad stop
                log.exception("keep_alive reaper")

    def start(self, period: float = 0.1) -> None:
        if self._reaper is None:
            self._loop = asyncio.get_running_loop()
            self._reaper = asyncio.ensure_future(self._reap_forever(period))

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for slot in list(self.slots.values()):
            if slot.task is not None:
                slot.task.cancel()
            if slot.obj is not None:
                await slot.obj.stop()
        self.slots.clear()

    # ---- what users see ---------------------------------------------------------------
    def ps(self) -> list[dict[str, Any]]:
        return ps_rows(self)

    def summary(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget, "used_bytes": self.used_bytes(), "pid": os.getpid(),
                "loads_total": dict(self.loads_total), "models": self.ps()}

    def _changed(self) -> None:
        for fn in self.on_change:
            fn()
