"""Test-only fault injection: named points in the write paths where a test can make the process
die (SIGKILL, exactly as ``kill -9``) or the disk fill up (ENOSPC), deterministically.

``ORTSERVE_CRASH_AT=<point>[:<n>][:<action>]`` (read by config.py, the only env reader) arms one
point: the ``n``-th time (1 by default) the process reaches it, ``kill`` (the default) prints
``ortserve: crash point <point> #<n>`` on stderr and SIGKILLs itself, so the harness knows where it
died; ``enospc`` raises ``OSError(ENOSPC)`` there instead, as a full disk would. Unset (always, in
production), ``point`` is one dictionary lookup. The points and what each one cuts are listed
in ``POINTS`` and docs/robustness.md; tests/crash_harness.py drives them.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from dataclasses import dataclass

POINTS = {
    "store.build": "a model variant's files are written in its temp directory, no manifest yet",
    "store.manifest": "the manifest is written and fsynced in the temp directory, not yet renamed into place",
    "store.swap": "a replaced variant (re-import) was moved aside, the new one not yet renamed into place",
    "store.installed": "the variant was renamed into place (committed), the import has not returned",
    "gguf.begun": "a GGUF import's temp directory exists, its conversion has begun",
    "gguf.written": "a GGUF import wrote its graph and weights, before measuring them",
    "adapter.written": "a LoRA import wrote the adapter's weights, not its metadata",
    "rag.upload.partial": "half of an uploaded file's bytes are in its temp file",
    "rag.upload.written": "an upload's bytes are fsynced in its temp file, its row not yet committed",
    "rag.upload.row": "an upload's row is committed, its bytes not yet renamed into place",
    "rag.upload.committed": "an upload's bytes are in place, the response not yet sent",
    "rag.enqueued": "a file was recorded in_progress in a vector store, not yet handed to the worker",
    "rag.ingest.embedded": "a file's chunks are embedded, nothing written yet",
    "rag.ingest.commit": "inside the transaction that writes a file's chunks, before COMMIT",
    "responses.commit": "inside the transaction that stores a response, before COMMIT",
    "ledger.commit": "inside the transaction that writes a cost-ledger row, before COMMIT",
}
ACTIONS = ("kill", "enospc")


@dataclass(frozen=True)
class Fault:
    point: str
    n: int = 1
    action: str = "kill"

    @classmethod
    def parse(cls, spec: str) -> Fault:
        parts = spec.strip().split(":")
        point, rest = parts[0], parts[1:]
        if point not in POINTS:
            raise ValueError(f"unknown crash point {point!r}; known: {', '.join(POINTS)}")
        n, action = 1, "kill"
        for p in rest:
            if p.isdigit() and int(p) >= 1:
                n = int(p)
            elif p in ACTIONS:
                action = p
            else:
                raise ValueError(f"crash point {spec!r}: expected <point>[:<n>=1,2,...][:{'|'.join(ACTIONS)}]")
        return cls(point, n, action)


_armed: Fault | None = None
_loaded = False
_hits: dict[str, int] = {}
_lock = threading.Lock()


def arm(spec: str | None) -> Fault | None:
    """Arm one point (``None`` disarms); the server arms from settings.crash_at at start."""
    global _armed, _loaded
    with _lock:
        _armed = Fault.parse(spec) if spec else None
        _loaded = True
        _hits.clear()
        return _armed


def _fault() -> Fault | None:
    if not _loaded:   # a CLI command (models import) reaches a point without a server arming it
        from ortserve.config import load_settings

        arm(load_settings().crash_at)
    return _armed


def point(name: str) -> None:
    """A named point in a write path: nothing unless armed here (see the module's docstring)."""
    fault = _fault()
    if fault is None or fault.point != name:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != fault.n:
            return
    if fault.action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected at crash point {name})")
    sys.stderr.write(f"ortserve: crash point {name} #{fault.n}\n")
    sys.stderr.flush()
    if hasattr(signal, "SIGKILL"):
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)   # Windows has no SIGKILL: an exit that runs no cleanup either
