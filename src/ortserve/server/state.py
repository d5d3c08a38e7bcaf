"""What the routes share: settings, the models (through the manager), metrics, lifecycle flags."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ortserve.config import Settings
from ortserve.engine import AsyncEngine
from ortserve.errors import Unavailable
from ortserve.server.manager import GENERIC_NAMES, ModelManager
from ortserve.telemetry.metrics import ServerMetrics


@dataclass
class ServerState:
    settings: Settings
    engine: AsyncEngine | None = None       # the pinned model the server started with
    model_dir: str = ""
    load_error: str | None = None
    draining: bool = False
    started: float = field(default_factory=time.time)
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    router: Any = None
    telemetry: Any = None
    manager: ModelManager | None = None
    embedder: Any = None       # server/embed_holder.EmbeddingHolder (issue 16), until the manager adopts it
    rerankers: Any = None      # server/reranking.RerankerHolder: cross-encoders, opened on first use
    responses: Any = None      # server/responses_store.ResponseStore: stored Responses API answers, opened lazily
    rag: Any = None            # rag/index.RagStore: files and vector stores (issue 16)
    speech: Any = None         # server/speech.SpeechHolder: Whisper models and the audio queue (issue 43)
    vision: Any = None         # server/vision.VisionHolder: vision models for image requests (issue 42)

    def record(self, span: Any, metrics: Any, finish_reason: str | None) -> None:
        """A finished generation, into Prometheus and the request's telemetry span."""
        self.metrics.observe(metrics)
        span.add_result(metrics, finish_reason)

    def ready_engine(self) -> AsyncEngine:
        """The pinned start model, or 503 while it loads (or after it failed)."""
        if self.draining:
            raise Unavailable("the server is shutting down")
        if self.engine is None:
            raise Unavailable(f"the model failed to load: {self.load_error}" if self.load_error
                              else "the model is still loading; retry shortly")
        return self.engine

    @property
    def served_id(self) -> str:
        return self.engine.model_id if self.engine is not None else ""

    async def engine_for(self, model: str | None, keep_alive: Any = None) -> AsyncEngine:
        """The started engine for the requested model: the pinned one for None, its id and its
        aliases; any other store model is loaded on first use (see server/manager.py).
        Call submit() right after, with no await between: that keeps an idle model from being
        unloaded in the gap."""
        default = self.ready_engine()
        if self.manager is None or model is None or model == default.model_id or model.lower() in GENERIC_NAMES:
            if self.manager is not None:
                await self.manager.get(None, keep_alive=None)  # counts the request
            return default
        engine: AsyncEngine = await self.manager.get(model, keep_alive=keep_alive)
        return engine


def state_of(request: Any) -> ServerState:
    """The server's state from a route's request (set on the app by create_app)."""
    return request.app.state.ortserve  # type: ignore[no-any-return]
