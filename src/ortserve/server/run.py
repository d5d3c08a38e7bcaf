"""Running the app under uvicorn, with a graceful drain on SIGTERM/SIGINT.

On the first signal the server stops taking work (new requests get 503 while the port
stays open), lets in-flight requests finish, then exits. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import uvicorn

from ortserve.config import Settings
from ortserve.engine.core import tune_heap
from ortserve.engine.heap import start_heap_trimmer
from ortserve.server import memtrace
from ortserve.server.app import create_app

log = logging.getLogger("ortserve.server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: Any, drain_timeout: float = 120.0) -> None:
        super().__init__(config)
        self.ortserve_state = state
        self.drain_timeout = drain_timeout
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.ortserve_state.draining or self.ortserve_state.engine is None:
            super().handle_exit(sig, frame)
            return
        log.info("draining: finishing in-flight requests, refusing new ones")
        self.ortserve_state.draining = True
        self._drain_task = asyncio.get_event_loop().create_task(self._drain(sig, frame))

    async def _drain(self, sig: int, frame: Any) -> None:
        engine = self.ortserve_state.engine
        manager = self.ortserve_state.manager
        deadline = asyncio.get_running_loop().time() + self.drain_timeout
        while asyncio.get_running_loop().time() < deadline:
            s = engine.stats()
            others_busy = manager is not None and any(slot.busy() for slot in list(manager.slots.values()))
            if s.running == 0 and s.waiting == 0 and not others_busy:  # every loaded model, not just the pinned
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # let the last responses flush
        super().handle_exit(sig, frame)


def serve(settings: Settings, model_dir: Path, model_id: str | None = None) -> None:
    tune_heap()  # before the model loads and its threads start (engine/core.py says why)
    start_heap_trimmer()  # freed heap back to the system under load too (engine/heap.py says why)
    memtrace.install(Path(settings.home).expanduser())  # ORTSERVE_DEBUG_TRACEMALLOC only
    app = create_app(settings, model_dir=model_dir, model_id=model_id)
    DrainingServer(uvicorn_config(app, settings), app.state.ortserve).run()


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    """uvicorn's settings for ``app``. An idle connection stays open ``http_keep_alive`` seconds
    (65 by default, as nginx's 75 and longer than the usual 60 s proxy idle timeout): at uvicorn's
    5 s, a client that reuses a pooled connection as the server's timer fires gets a closed
    socket (``RemoteProtocolError``/``ReadError``), which the one-hour soak saw 3 times under load
    (docs/robustness.md). Longer than clients keep idle connections, the client closes first."""
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                          timeout_graceful_shutdown=30, timeout_keep_alive=settings.http_keep_alive)
