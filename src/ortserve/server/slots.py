"""One model the manager knows about (``Slot``), the managed face of a model another part
loaded (``External``), and keep_alive durations as requests and settings spell them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Slot:
    """One model the manager knows about: loading, loaded, or (after unload) forgotten."""

    id: str
    kind: str
    dir: Path
    planned_bytes: int
    pinned: bool = False
    obj: Any = None
    task: asyncio.Task[Any] | None = None
    loaded_at: float = 0.0
    last_used: float = field(default_factory=time.monotonic)
    requests: int = 0
    loads: int = 0
    keep_alive: float | None = None   # the last request's override; None = the server setting
    rss_delta: int = 0
    error: str | None = None
    waiters: int = 0                  # requests between "give me the model" and their submit


    @property
    def state(self) -> str:
        return "loaded" if self.obj is not None else "loading"

    def busy(self) -> bool:
        if self.waiters:
            return True
        if self.obj is None:
            return False
        check = getattr(self.obj, "busy", None)
        if callable(check):
            return bool(check())
        stats = getattr(self.obj, "stats", None)
        if callable(stats):
            s = stats()
            return bool(s.running or s.waiting)
        return False


def parse_keep_alive(value: Any) -> float | None:
    """Seconds from a number or a duration like "30s", "5m", "1h"; -1 (any negative) = forever."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("keep_alive must be seconds or a duration like '5m'")  # noqa: TRY004 - pydantic wants ValueError
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError("keep_alive must be finite")
        return -1.0 if value < 0 else float(value)
    text = str(value).strip().lower()
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix):
            try:
                return parse_keep_alive(float(text[: -len(suffix)]) * units[suffix])
            except ValueError:
                break
    try:
        return parse_keep_alive(float(text))
    except ValueError:
        raise ValueError(f"keep_alive {value!r} is not seconds or a duration like '30s', '5m', '1h'") from None


class External:
    """The managed face of a model another part loaded: stopping it calls its ``close``."""

    def __init__(self, close: Callable[[], None]) -> None:
        self.close = close

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await asyncio.to_thread(self.close)

    def busy(self) -> bool:
        return False
