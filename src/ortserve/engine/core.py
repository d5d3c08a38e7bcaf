"""The engine loop, in one thread: schedule -> run -> postprocess.

The scheduler admits waiting sequences into free KV rows (prefill, within a token budget
per step so running sequences keep decoding), then one batched decode step advances every
running sequence, then each sequence samples, streams its text and retires when done.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import numpy as np

from ortserve.engine.runner import Runner
from ortserve.engine.sampler import apply_penalties, sample
from ortserve.engine.sequence import Sequence
from ortserve.types import EngineStats, TokenEvent

log = logging.getLogger("ortserve.engine")


class EngineCore:
    def __init__(self, runner: Runner, *, max_prefill_tokens: int = 512) -> None:
        self.runner = runner
        self.eos = set(runner.spec.eos_token_ids)
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self._cond = threading.Condition()
        self._aborts: set[str] = set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self.total_requests = 0
        self.total_output_tokens = 0
        self.prefill_tokens = 0
        self.prefill_seconds = 0.0
        self.decode_tokens = 0
        self.decode_seconds = 0.0
        self.fault: Exception | None = None  # set by tests to make the next step fail

    # ---- thread-safe API --------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ortserve-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def add(self, seq: Sequence) -> None:
        with self._cond:
            self.waiting.append(seq)
            self.total_requests += 1
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        with self._cond:
            self._aborts.add(request_id)
            self._cond.notify()

    def stats(self) -> EngineStats:
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self._recent) if now - t < 5.0]
        tps = sum(n for _, n in recent) / 5.0 if recent else 0.0
        return EngineStats(running=sum(not s.finished for s in self.running), waiting=len(self.waiting),
                           tokens_per_second=tps, total_requests=self.total_requests,
                           total_output_tokens=self.total_output_tokens)

    # ---- loop -------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self.waiting and not self.running and not self._aborts:
                    self._cond.wait()
                if self._stop and not self.waiting and not self.running:
                    return
                aborts, self._aborts = self._aborts, set()
            try:
                self._apply_aborts(aborts)
                self.step()
            except Exception as exc:  # a failing step must not take the server down
                log.exception("engine step failed")
                self._fail_all(exc)

    def step(self) -> None:
        self._admit()
        if self.running:
            if self.fault is not None:  # tests: fail this decode step, as a broken kernel would
                fault, self.fault = self.fault, None
                raise fault
            self._decode()
        elif self.runner.capacity > 1024:
            self.runner.shrink()

    def _admit(self) -> None:
        budget = self.max_prefill_tokens
        admitted = 0
        while len(self.running) < self.runner.slots:
            with self._cond:
                # always admit one; more only while they fit the step's prefill budget
                if not self.waiting or (admitted and len(self.waiting[0].prompt_ids) > budget):
                    return
                seq = self.waiting.popleft()
            admitted += 1
            seq.row = len(self.running)
            seq.started_at = time.perf_counter()
            self.running.append(seq)
            t0 = time.perf_counter()
            logits = self.runner.prefill(seq.row, seq.prompt_ids)
            self.prefill_seconds += time.perf_counter() - t0
            self.prefill_tokens += len(seq.prompt_ids)
            budget -= len(seq.prompt_ids)
            self._postprocess(seq, logits)
            self._retire_finished()

    def _decode(self) -> None:
        tokens = np.fromiter((s.pending for s in self.running), dtype=np.int64, count=len(self.running))
        t0 = time.perf_counter()
        logits = self.runner.decode(tokens)
        now = time.perf_counter()
        self.decode_seconds += now - t0
        self.decode_tokens += len(tokens)
        self._recent.append((now, len(tokens)))
        while self._recent and now - self._recent[0][0] > 5.0:
            self._recent.popleft()
        for i, seq in enumerate(self.running):
            self._postprocess(seq, logits[i])
        self._retire_finished()

    def _postprocess(self, seq: Sequence, logits: np.ndarray) -> None:
        p = seq.params
        if len(seq.output_ids) < p.min_tokens or p.ignore_eos:
            logits = logits.copy()
            logits[list(self.eos)] = -np.inf
        elif p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
            logits = logits.copy()
        logits = apply_penalties(logits, p, seq.prompt_ids, seq.counts)
        token = sample(logits, p, seq.rng)
        if token in self.eos:
            self._finish(seq, "stop")
            return
        text = seq.accept(token)
        self.total_output_tokens += 1
        if seq.stop.stopped:
            self._emit(seq, text)
            self._finish(seq, "stop")
        elif len(seq.output_ids) >= p.max_tokens:
            self._emit(seq, text)
            self._finish(seq, "length")
        elif text:
            self._emit(seq, text, [token])

    def _emit(self, seq: Sequence, text: str, ids: list[int] | None = None) -> None:
        seq.sink(TokenEvent(request_id=seq.id, text=text, token_ids=ids or []))

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        text = seq.tail() if reason in ("stop", "length") else ""
        seq.finished = True
        seq.sink(TokenEvent(request_id=seq.id, text=text, finished=True, finish_reason=reason,
                            metrics=seq.metrics(), error=error))

    def _retire_finished(self) -> None:
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if seq.finished:
                last = self.running.pop()
                if last is not seq:
                    self.runner.move(last.row, seq.row)
                    last.row = seq.row
                    self.running[i] = last
                else:
                    self.runner.clear(seq.row)
            else:
                i += 1

    def _apply_aborts(self, ids: set[str]) -> None:
        if not ids:
            return
        with self._cond:
            queued = [s for s in self.waiting if s.id in ids]
            for s in queued:
                self.waiting.remove(s)
        for s in queued + [s for s in self.running if s.id in ids and not s.finished]:
            s.aborted = True
            self._finish(s, "abort")
        self._retire_finished()

    def _fail_all(self, exc: Exception) -> None:
        message = f"generation failed: {type(exc).__name__}: {exc}"
        for s in self.running:
            if not s.finished:
                self._finish(s, "error", error=message)
        self.running.clear()
        self.runner.lengths[:] = 0
