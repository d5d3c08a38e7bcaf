"""The shared part of the server's side models (embedders, cross-encoders, Whisper): a dict of
loaded models by store variant id, opened on first use under one lock, and handed to the
model manager (``adopt_external``) so that each shows in ``ps`` and /metrics, counts against the
memory budget, obeys keep_alive and can be evicted (``close`` drops it).

A subclass names its ``kind`` (as ``ps`` shows it), opens one model (``open``) and, when requests
name models rather than variants, says which variant a name means (``resolve``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from ortserve.models.store import Variant


class Sized(Protocol):
    def memory_bytes(self) -> int: ...


M = TypeVar("M", bound=Sized)


class ModelHolder(Generic[M]):
    kind: ClassVar[str]     # the manager's kind for these models: "embedding", "reranker", "audio"

    def __init__(self, store: Any, threads: int = 0) -> None:
        self.store = store
        self.threads = threads
        self._loaded: dict[str, tuple[Variant, M]] = {}
        self._lock = threading.Lock()
        self.manager: Any = None    # server/manager.ModelManager: budget, keep_alive, ps

    def open(self, v: Variant) -> M:
        """Load variant ``v`` (a store Variant) from its directory."""
        raise NotImplementedError

    def resolve(self, ref: str | None) -> Variant:
        """The variant a request's model name means (errors name ``model``)."""
        raise NotImplementedError

    def get(self, ref: str | None = None) -> tuple[Variant, M]:
        """The variant ``ref`` means and its model, loaded on first use. The name is resolved
        under the lock, so that two first requests import or open a model once."""
        with self._lock:
            return self._hold(self.resolve(ref))

    def hold(self, v: Variant) -> tuple[Variant, M]:
        """Variant ``v`` and its model, loaded on first use."""
        with self._lock:
            return self._hold(v)

    def _hold(self, v: Variant) -> tuple[Variant, M]:
        if v.id not in self._loaded:
            m = self.open(v)
            self._loaded[v.id] = (v, m)
            if self.manager is not None:
                self.manager.adopt_external(v.id, self.kind, v.model_dir, m.memory_bytes(),
                                            lambda vid=v.id: self.close(vid))
        if self.manager is not None:
            self.manager.touch(v.id)
        return self._loaded[v.id]

    def loaded(self) -> list[dict[str, Any]]:
        return [{"id": v.id, "memory_bytes": m.memory_bytes()} for v, m in self._loaded.values()]

    def memory_bytes(self) -> int:
        return sum(m.memory_bytes() for _, m in self._loaded.values())

    def close(self, ref: str | None = None) -> None:
        """Drop every model (None), one variant id, or every variant of one model name."""
        with self._lock:
            for key in [k for k in self._loaded if ref is None or k == ref or k.split(":")[0] == ref]:
                del self._loaded[key]
