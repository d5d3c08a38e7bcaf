"""Loopback helpers shared by the benchmark backends, the benchmarks and the tests: a free
port on 127.0.0.1, and waiting for a server's /healthz."""

from __future__ import annotations

import socket
import time
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, timeout: float, proc: Any = None, poll: float = 0.2) -> bool:
    """Poll ``url``/healthz until it answers 200 (True), ``timeout`` seconds pass, or ``proc``
    (a Popen running the server) exits (False)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(poll)
    return False
