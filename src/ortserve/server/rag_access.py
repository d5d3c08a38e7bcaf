"""The server's RAG store, shared by the files, vector-store and file_search routes: opened on first
use with its background worker, and a helper that runs store calls under its writer lock."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fastapi import Request

from ortserve.rag import owners
from ortserve.rag.index import RagStore
from ortserve.rag.jobs import IngestWorker
from ortserve.server.state import state_of

_OPEN = threading.Lock()


def rag_of(request: Request) -> RagStore:
    return open_rag(state_of(request))


def open_rag(st: Any) -> RagStore:
    """The server's RAG store, opened on first use (it embeds with the server's embedding holder),
    with its background worker for files added to vector stores."""
    with _OPEN:
        if st.rag is None:
            rag = RagStore(st.settings.rag_path, lambda: st.embedder.get()[1])
            with rag_lock():
                owners.migrate(rag.main)   # which tenant owns each file and store (server/tenancy.py)
            rag.worker = IngestWorker(rag, st.settings.rag_queue_size)
            rag.worker.start()
            st.rag = rag
    return st.rag  # type: ignore[no-any-return]


def start_rag(st: Any) -> None:
    """At server start: resume files an earlier server left in_progress (if there is a store)."""
    if (st.settings.rag_path / "rag.sqlite").is_file():
        open_rag(st)


def stop_rag(st: Any) -> None:
    if st.rag is not None and st.rag.worker is not None:
        st.rag.worker.stop()


def rag_lock() -> Any:
    from ortserve.rag.index import _TX_LOCK

    return _TX_LOCK


async def locked(fn: Any, *args: Any, **kw: Any) -> Any:
    def run() -> Any:
        with rag_lock():
            return fn(*args, **kw)

    return await asyncio.to_thread(run)


