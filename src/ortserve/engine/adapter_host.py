"""The LoRA side of AsyncEngine (engine/lora.py): which adapters it serves, adding and dropping
them while it runs (a rebind, never a new session), and the key each request's rows run with."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from ortserve.engine.lora import Adapter, AdapterView, adapter_key, split_key
from ortserve.engine.sequence import Sequence
from ortserve.errors import InvalidRequest, ModelError
from ortserve.types import SamplingParams


class AdapterHost:
    """Mixed into AsyncEngine: needs ``model`` (LoadedModel), ``core`` (EngineCore) and ``model_id``."""

    model: Any
    core: Any
    model_id: str
    _lora_seqs: list[Sequence]
    # one change of the adapter set at a time, its stacks built outside the event loop; a change
    # ends when the runner has the stacks (set, or staged for the next admission)
    _adapter_lock: threading.Lock

    @property
    def adapter_names(self) -> list[str]:
        return [a.name for a in self.model.adapters]

    def with_adapter(self, adapter: str, model_id: str | None = None, reload: Any = None) -> AdapterView:
        """This engine as requests for ``adapter`` see it: same session, same KV budget (``reload``:
        loads the adapter again should it be dropped before the request is submitted)."""
        if adapter not in self.adapter_names:
            raise InvalidRequest(f"adapter {adapter!r} is not loaded on {self.model_id} "
                                 f"(loaded: {', '.join(self.adapter_names) or 'none'})", param="model",
                                 code="model_not_found")
        return AdapterView(self, adapter, model_id or f"{self.model_id}:{adapter}", reload)

    def add_adapter(self, adapter: Adapter) -> None:
        """Serve one more adapter (or a new version of one): a rebind, no new session. The stacks are
        built on the calling thread; ``add_adapter_async`` builds them off the event loop."""
        if not self.core.runner.lora_targets:
            raise ModelError(f"{self.model_id} was loaded without LoRA support; unload it (or restart) "
                             f"to serve adapter {adapter.name!r}")
        with self._adapter_lock:
            adapters = list(self.model.adapters)
            names = [a.name for a in adapters]
            if adapter.name in names:  # a replaced adapter keeps its index: running rows point at it
                adapters[names.index(adapter.name)] = adapter
            else:
                adapters.append(adapter)
            self._apply_adapters(adapters)
            self.model.adapters = adapters  # named to requests only once the runner has its stacks

    async def add_adapter_async(self, load: Callable[[], Adapter]) -> None:
        """``add_adapter(load())`` in a worker thread: reading the files and building the stacks
        (tenths of a second at 1B) never stall the other requests' streams."""
        await asyncio.to_thread(lambda: self.add_adapter(load()))

    def remove_adapter(self, name: str) -> bool:
        """Stop serving ``name`` (its keep_alive passed, server/adapters.py): its weights leave the
        stacks (a rebind, no new session). False, changing nothing, while a request of it is in flight."""
        rebuild = self.begin_remove(name, wait=True)
        if rebuild is None:
            return False
        rebuild()
        return True

    def begin_remove(self, name: str, *, wait: bool = False) -> Callable[[], None] | None:
        """On the event loop: offer ``name`` to no new request from now, and return the rebuild of
        the stacks without it, to run on any thread (it ends the change). None, changing nothing,
        while a request of it is in flight, when it is not loaded, or (``wait`` False) while another
        change is being built: the reaper tries again on its next round."""
        if not self._adapter_lock.acquire(blocking=wait):
            return None
        if name not in self.adapter_names or name in self.adapters_in_use():
            self._adapter_lock.release()
            return None
        adapters = [a for a in self.model.adapters if a.name != name]
        self.model.adapters = adapters  # a request for it from now on loads it again, after this change

        def rebuild() -> None:
            try:
                self._apply_adapters(adapters)
            finally:
                self._adapter_lock.release()
        return rebuild

    def adapters_in_use(self) -> set[str]:
        """The adapters of requests submitted and not finished: queued, running or preempted."""
        self._lora_seqs = [s for s in self._lora_seqs if not s.finished]
        return {split_key(s.adapter)[0] for s in self._lora_seqs}

    def _apply_adapters(self, adapters: list[Adapter]) -> None:
        """The runner serves ``adapters``: now when the loop is idle (the weights of a dropped
        adapter are freed at once), else from its next admission. Under ``_adapter_lock``."""
        core = self.core
        inputs = core.runner.lora_inputs(adapters)  # built here, so the loop thread only swaps them in
        with core._cond:  # held: the loop thread cannot start a step
            if not core.has_work() and core.step_started is None:
                core.runner.set_adapters(adapters, inputs)
                return
        core.runner.stage_adapters(adapters, inputs)

    def _adapter_key(self, adapter: str, params: SamplingParams) -> str:
        """What the sequence runs with (engine/lora.py adapter_key): ``lora_scale`` is the request's
        scale on alpha/r, so the row's multiplier is it over the scale folded in at import."""
        if params.lora_scale is None:
            return adapter
        if not adapter:
            raise InvalidRequest(f"'lora_scale' scales a LoRA adapter, but the request's model is the base model "
                                 f"{self.model_id}; name an adapter in 'model'", param="lora_scale")
        stored = float(next(a for a in self.model.adapters if a.name == adapter).meta.get("scale", 1.0))
        if stored == 0:
            raise InvalidRequest(f"adapter {adapter!r} was imported with --scale 0 (its weights are zero): "
                                 "it cannot be scaled per request", param="lora_scale")
        return adapter_key(adapter, params.lora_scale / stored)
