"""What the routes share: settings, the engine once loaded, metrics, lifecycle flags."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ortserve.config import Settings
from ortserve.engine import AsyncEngine
from ortserve.errors import Unavailable
from ortserve.telemetry.metrics import ServerMetrics


@dataclass
class ServerState:
    settings: Settings
    engine: AsyncEngine | None = None
    model_dir: str = ""
    load_error: str | None = None
    draining: bool = False
    started: float = field(default_factory=time.time)
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    router: Any = None
    telemetry: Any = None

    def record(self, span: Any, metrics: Any, finish_reason: str | None) -> None:
        """A finished generation, into Prometheus and the request's telemetry span."""
        self.metrics.observe(metrics)
        span.add_result(metrics, finish_reason)

    def ready_engine(self) -> AsyncEngine:
        if self.draining:
            raise Unavailable("the server is shutting down")
        if self.engine is None:
            raise Unavailable(f"the model failed to load: {self.load_error}" if self.load_error
                              else "the model is still loading; retry shortly")
        return self.engine
