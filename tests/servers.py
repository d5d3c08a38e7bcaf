"""A real uvicorn server on a loopback port, in a thread, for HTTP tests."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, Self

import uvicorn

from ortserve.config import load_settings
from ortserve.loopback import free_port, wait_healthy
from ortserve.server.app import create_app


class ServerThread:
    def __init__(self, model_dir: Path, model_id: str = "tiny", manager_clock: Any = None, **settings: Any) -> None:
        """``manager_clock``: the model manager's clock from the start (tests/clocks.py ManualClock),
        so nothing expires by real time before the test looks, however long the start takes."""
        self.port = free_port()
        self.settings = load_settings(host="127.0.0.1", port=self.port, **settings)
        self.app = create_app(self.settings, model_dir=model_dir, model_id=model_id)
        self.state = self.app.state.ortserve
        if manager_clock is not None:
            self.state.manager.clock = manager_clock
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self.thread.start()
        if wait_healthy(self.url, 60):
            return self
        raise RuntimeError("server did not become healthy")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def wait_idle(self, timeout: float = 120.0) -> Any:
        """The engine's stats once nothing runs or waits; ``timeout`` only guards against a hang."""
        deadline = time.monotonic() + timeout
        stats = self.state.engine.stats()
        while time.monotonic() < deadline:
            stats = self.state.engine.stats()
            if stats.running == 0 and stats.waiting == 0:
                break
            time.sleep(0.05)
        return stats



    def reap(self) -> None:
        """One keep_alive pass of the model manager on the server's own loop, now: a test that moved
        the manager's clock (tests/clocks.py) reads the decision without waiting for the reaper."""
        manager = self.state.manager
        asyncio.run_coroutine_threadsafe(manager.reap_once(), manager._loop).result(120)
