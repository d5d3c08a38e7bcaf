"""What `ortserve ps` and GET /v1/admin/ps show: the model manager's slots as rows."""

from __future__ import annotations

from typing import Any


def draft_of_engine(engine: Any) -> Any:
    """The draft model (engine/speculation/draft.py) an engine speculates with, or None."""
    return getattr(getattr(engine, "model", None), "draft", None)


def ps_rows(manager: Any) -> list[dict[str, Any]]:
    """One row per loaded (or loading) model: what `ortserve ps` and /v1/admin/ps show."""
    now = manager.clock()
    rows = []
    for s in sorted(manager.slots.values(), key=lambda s: (not s.pinned, s.id)):
        ka = -1.0 if s.pinned else manager.keep_alive_of(s)
        idle = 0.0 if s.busy() else now - s.last_used
        stats = getattr(s.obj, "stats", None)
        st = stats() if callable(stats) else None
        rows.append({"model": s.id, "kind": s.kind, "state": s.state, "pinned": s.pinned,
                     "memory_bytes": s.planned_bytes, "rss_delta_bytes": s.rss_delta,
                     "requests": s.requests, "loads": s.loads, "idle_seconds": round(idle, 3),
                     "keep_alive": ka,
                     "expires_in": None if ka < 0 or s.obj is None else round(max(0.0, ka - idle), 3),
                     "running": getattr(st, "running", 0), "waiting": getattr(st, "waiting", 0),
                     "device": getattr(s.obj, "device", None), "path": str(s.dir),
                     "adapters": list(getattr(s.obj, "adapter_names", [])),
                     "draft": draft.id if (draft := draft_of_engine(s.obj)) is not None else None,
                     "adapters_expire_in": manager.adapter_use.expires_in(manager, s, now)})
    return rows
