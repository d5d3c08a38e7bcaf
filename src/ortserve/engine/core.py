"""The engine loop, in one thread: schedule -> run -> postprocess.

Each step the scheduler
  * admits waiting sequences while KV rows and the KV byte budget allow,
  * gives at most ``chunk_tokens`` prompt tokens to prefill (a long prompt is prefilled in
    chunks over several steps, so running sequences keep decoding in between); while
    sequences decode, the chunk is also held to a time budget, ``prefill_ratio`` x the
    measured decode step, converted to tokens with the measured prefill cost per token, so a
    step with a chunk takes about ``1 + prefill_ratio`` decode steps on any hardware or load,
  * preempts the newest sequence when decode growth would pass the KV budget (it is
    re-admitted later by recomputing its prefix, so its tokens do not change);
then the runner runs the prefill chunks and one batched decode step, and each sequence is
postprocessed on its own (sample, stream text, retire).

Failures stay with the request that caused them: a batched decode step that raises is
retried row by row to find the culprit, and only that request ends with an error; a
request whose own postprocess raises (sampling, detokenizing, a grammar) fails alone.

Row layout: decoding sequences occupy KV rows ``0..d-1`` (kept compact), and the one
sequence being prefilled in chunks, if any, sits at row ``d``.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import statistics
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ortserve.engine.guidance import Guidance, allocate_masks, apply_mask
from ortserve.engine.runner import Runner
from ortserve.engine.sampler import apply_penalties, sample, token_logprobs
from ortserve.engine.sequence import Sequence
from ortserve.types import EngineStats, TokenEvent

log = logging.getLogger("ortserve.engine")

IDLE_CAPACITY = 256  # tokens per row kept when idle; more is given back
# Decode tokens reserved at admission beyond the prefix. Reserving all of max_tokens would
# leave most of the budget idle (answers usually stop early); past this, growth preempts.
ADMIT_HEADROOM = 16
MIN_CHUNK = 16  # the time budget never cuts a prompt chunk below this many tokens
RECENT = 16     # the budget uses the median of this many recent decode steps and prompt chunks


class EngineCrash(BaseException):
    """Tests: raised in the loop thread to kill it, as a fatal native error would."""


@dataclass
class Plan:
    """What one step runs: prompt chunks to prefill, then one decode step over ``decode``."""

    decode: list[Sequence] = field(default_factory=list)
    prefill_budget: int = 0


class EngineCore:
    def __init__(self, runner: Runner, *, chunk_tokens: int = 512, prefill_ratio: float = 0.0,
                 kv_budget_bytes: int | None = None, guidance: Guidance | None = None) -> None:
        self.runner = runner
        self.guidance = guidance  # grammar masks for constrained sequences (engine/guidance.py)
        self._masks = allocate_masks(runner.slots, runner.spec.vocab_size)
        self._one_mask = allocate_masks(1, runner.spec.vocab_size)
        self._mask_pool: ThreadPoolExecutor | None = None
        self.mask_seconds = 0.0  # time the loop waited for grammar masks after a decode step
        self.eos = set(runner.spec.eos_token_ids)
        self.chunk_tokens = max(1, chunk_tokens)
        self.prefill_ratio = prefill_ratio  # 0: chunks of chunk_tokens only, no time budget
        # measured: a step's time outside prefill, and prefill time per prompt token. Medians, not
        # means: one step stretched by the OS (a busy machine) must not inflate the budget
        self._step_times: collections.deque[float] = collections.deque(maxlen=RECENT)
        self._token_times: collections.deque[float] = collections.deque(maxlen=RECENT)
        self.kv_budget = kv_budget_bytes or (1 << 62)
        runner.byte_limit = self.kv_budget
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []        # decoding, rows 0..d-1
        self.prefilling: Sequence | None = None  # being prefilled in chunks, row d
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
        self.preemptions = 0
        self.failed_rows = 0
        self.step_started: float | None = None  # monotonic time the current step began
        self.died: str | None = None             # why the loop thread ended abnormally
        # Tests: faults planted per request. "step" makes any model call that includes the
        # request's row raise (as a broken kernel would); "postprocess" makes its sampling raise.
        self.faults: dict[str, tuple[str, BaseException]] = {}
        self.fault: Exception | None = None  # planted as a "step" fault on the next sequence scheduled
        self.crash: BaseException | None = None  # raised in the loop thread, outside step isolation

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

    def plant_fault(self, request_id: str, exc: BaseException, where: str = "step") -> None:
        """Tests: ``where`` is "step" (its model calls raise ``exc``), "postprocess" (its sampling
        raises ``exc``) or "stall" (its next model call sleeps ``str(exc)`` seconds, once)."""
        self.faults[request_id] = (where, exc)

    def kill(self, exc: BaseException | None = None) -> None:
        """Tests: make the loop thread die, as an uncaught native error would."""
        with self._cond:
            self.crash = exc or EngineCrash("engine thread killed")
            self._cond.notify()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stalled_for(self) -> float:
        """Seconds the current step has been running (0 when idle)."""
        started = self.step_started
        return time.monotonic() - started if started is not None else 0.0

    def fits(self, rows: int, tokens: int) -> bool:
        """Whether ``rows`` KV rows of ``tokens`` tokens stay within the KV budget."""
        return rows * tokens * self.runner.bytes_per_token <= self.kv_budget

    def stats(self) -> EngineStats:
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self._recent) if now - t < 5.0]
        tps = sum(n for _, n in recent) / 5.0 if recent else 0.0
        busy = sum(not s.finished for s in list(self.running)) + (self.prefilling is not None)
        return EngineStats(running=busy, waiting=len(self.waiting), tokens_per_second=tps,
                           total_requests=self.total_requests, total_output_tokens=self.total_output_tokens)

    # ---- loop -------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._stop or self.waiting or self.running or self.prefilling
                               or self._aborts or self.crash):
                        self._cond.wait()
                    if self.crash is not None:
                        raise self.crash
                    if self._stop and not self.waiting and not self.running and not self.prefilling:
                        return
                    aborts, self._aborts = self._aborts, set()
                self.step_started = time.monotonic()
                try:
                    self._apply_aborts(aborts)
                    self.step()
                except Exception as exc:  # a bug outside per-request isolation: fail what runs, go on
                    log.exception("engine step failed")
                    self.fail_all(f"generation failed: {type(exc).__name__}: {exc}")
                finally:
                    self.step_started = None
        except BaseException as exc:  # the thread ends; the watchdog sees why
            self.died = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, EngineCrash):
                log.critical("engine thread died: %s", self.died, exc_info=exc)

    def step(self) -> None:
        t0 = time.perf_counter()
        plan = self._schedule()
        prefilled = self.prefill_seconds
        self._prefill(plan.prefill_budget)
        prefilled = self.prefill_seconds - prefilled
        if plan.decode:
            self._decode(plan.decode)
            self._step_times.append(time.perf_counter() - t0 - prefilled)
        self._retire_finished()
        if not self.running and not self.prefilling and not self.waiting:
            self._release_idle_memory()

    # ---- schedule ---------------------------------------------------------
    def _schedule(self) -> Plan:
        """Preempt while decode growth would pass the budget; the decode batch is what stays."""
        while self.running or self.prefilling:
            rows = len(self.running) + (self.prefilling is not None)
            need = max([int(self.runner.lengths[s.row]) + 1 for s in self.running]
                       + ([len(self.prefilling.prefix())] if self.prefilling else []))
            if self.fits(rows, need) or rows == 1:
                break
            self._preempt_newest()
        return Plan(decode=list(self.running), prefill_budget=self.prefill_tokens_now())

    def prefill_tokens_now(self) -> int:
        """Prompt tokens this step may prefill: ``chunk_tokens``, and while sequences decode at most
        what fits in ``prefill_ratio`` x the measured decode step (never under ``MIN_CHUNK``).

        Why time, not tokens: a step that prefills costs the running streams ``chunk time`` on top
        of their decode step, and the long prompt waits one decode step per chunk. With the chunk
        at r decode steps, stream TPOT is (1 + r) x and the prompt's TTFT (1 + 1/r) x what they
        would be alone, whatever the machine and its load; a fixed token count lands anywhere on
        that curve depending on how fast the hardware is right now.
        """
        step, per_token = self.step_seconds, self.prefill_token_seconds
        if not self.running or self.prefill_ratio <= 0 or not step or not per_token:
            return self.chunk_tokens
        return max(MIN_CHUNK, min(self.chunk_tokens, int(self.prefill_ratio * step / per_token)))

    @property
    def step_seconds(self) -> float | None:
        """Median time of the recent decode steps, prefill excluded."""
        return statistics.median(self._step_times) if self._step_times else None

    @property
    def prefill_token_seconds(self) -> float | None:
        """Median prefill time per prompt token over the recent chunks."""
        return statistics.median(self._token_times) if self._token_times else None

    def _preempt_newest(self) -> None:
        candidates = self.running + ([self.prefilling] if self.prefilling else [])
        victim = max(candidates, key=lambda s: s.started_at or 0.0)
        log.info("KV budget full: preempting %s (%d tokens), it resumes later", victim.id, victim.cached)
        self.preemptions += 1
        victim.preempted += 1
        victim.cached = 0
        victim.finished = True  # retire its row now
        self._retire_finished()
        victim.finished = False
        victim.row = -1
        with self._cond:
            self.waiting.appendleft(victim)  # first to come back

    def _admit_next(self) -> Sequence | None:
        """The next waiting sequence into row d, if a row and the KV budget allow."""
        with self._cond:
            if not self.waiting or len(self.running) >= self.runner.slots:
                return None
            seq = self.waiting[0]
            need = [int(self.runner.lengths[s.row]) + 1 for s in self.running]
            # room for its prefix plus some decode growth, next to what already runs
            want = min(len(seq.prefix()) + 1 + min(seq.params.max_tokens, ADMIT_HEADROOM),
                       self.runner.spec.context_length)
            if self.running and not self.fits(len(self.running) + 1, max(need + [want])):
                return None
            self.waiting.popleft()
        if self.fault is not None:  # tests: the next scheduled sequence carries the fault
            self.plant_fault(seq.id, self.fault)
            self.fault = None
        seq.row = len(self.running)
        seq.cached = 0
        if seq.started_at is None:
            seq.started_at = time.perf_counter()
        return seq

    # ---- run --------------------------------------------------------------
    def _prefill(self, budget: int) -> None:
        """Spend up to ``budget`` prompt tokens: finish the sequence in progress, then start new ones."""
        while budget > 0:
            seq = self.prefilling or self._admit_next()
            if seq is None:
                return
            self.prefilling = seq
            prefix = seq.prefix()
            start = seq.cached
            end = min(len(prefix), start + budget)
            last = end == len(prefix)
            t0 = time.perf_counter()
            try:
                self._check_fault(seq, "step")
                logits = self.runner.prefill(seq.row, prefix[start:end], start=start, total=len(prefix))
            except Exception as exc:  # noqa: BLE001 - whatever a kernel raises ends this request only
                self.prefilling = None
                self._fail(seq, exc)
                self.runner.clear(seq.row)
                continue
            spent = time.perf_counter() - t0
            self.prefill_seconds += spent
            self.prefill_tokens += end - start
            self._token_times.append(spent / (end - start))
            budget -= end - start
            seq.cached = end
            if not last:
                return  # the rest in the next steps, between decode steps
            self.prefilling = None
            self.running.append(seq)
            if seq.output_ids:  # resumed after preemption: its next token is already sampled
                continue
            self._postprocess(seq, logits)

    def _decode(self, batch: list[Sequence]) -> None:
        """One token for every sequence in ``batch`` (rows 0..n-1); a failing step is retried per row."""
        n = len(batch)
        tokens = np.fromiter((s.pending for s in batch), dtype=np.int64, count=n)
        masks = self._start_masks(batch)
        t0 = time.perf_counter()
        try:
            for s in batch:
                self._check_fault(s, "step")
            logits = self.runner.decode(tokens)
        except Exception as exc:  # noqa: BLE001 - any failure: find the culprit row by row
            log.warning("batched decode of %d rows failed (%s: %s); retrying row by row", n,
                        type(exc).__name__, exc)
            self._wait_masks(masks)
            self._decode_rows(batch, tokens, masks is not None)
            return
        self._wait_masks(masks)
        now = time.perf_counter()
        self._account_decode(now, now - t0, n)
        for i, seq in enumerate(batch):
            self._postprocess(seq, logits[i], self._masks[i] if masks is not None else None)

    def _start_masks(self, batch: list[Sequence]) -> Future[None] | None:
        """Grammar masks of every constrained row, in parallel threads, while the model runs."""
        guided = [(s.guide, i) for i, s in enumerate(batch) if s.guide is not None]
        if not guided or self.guidance is None:
            return None
        if self._mask_pool is None:
            self._mask_pool = ThreadPoolExecutor(1, thread_name_prefix="ortserve-masks")
        return self._mask_pool.submit(self.guidance.fill_masks, guided, self._masks)

    def _wait_masks(self, masks: Future[None] | None) -> None:
        if masks is not None:
            t0 = time.perf_counter()
            masks.result()
            self.mask_seconds += time.perf_counter() - t0

    def _decode_rows(self, batch: list[Sequence], tokens: np.ndarray, masked: bool = False) -> None:
        for i, seq in enumerate(batch):
            t0 = time.perf_counter()
            try:
                self._check_fault(seq, "step")
                logits = self.runner.decode(tokens[i:i + 1], start=i)
            except Exception as exc:  # noqa: BLE001 - whatever a kernel raises ends this request only
                self._fail(seq, exc)
                continue
            now = time.perf_counter()
            self._account_decode(now, now - t0, 1)
            self._postprocess(seq, logits[0], self._masks[i] if masked else None)

    def _account_decode(self, now: float, seconds: float, n: int) -> None:
        self.decode_seconds += seconds
        self.decode_tokens += n
        self._recent.append((now, n))
        while self._recent and now - self._recent[0][0] > 5.0:
            self._recent.popleft()

    def _check_fault(self, seq: Sequence, where: str) -> None:
        planted = self.faults.get(seq.id)
        if planted is None:
            return
        if where == "step" and planted[0] == "stall":  # tests: a kernel that hangs for a while
            self.faults.pop(seq.id, None)
            time.sleep(float(str(planted[1])))
        elif planted[0] == where:
            raise planted[1]

    # ---- postprocess (per sequence) ---------------------------------------
    def _postprocess(self, seq: Sequence, logits: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Everything one sequence does with its logits row; what raises here ends only this request."""
        if seq.finished:
            return
        try:
            self._check_fault(seq, "postprocess")
            token = self.select(seq, logits, mask)
            self._advance(seq, token)
        except Exception as exc:
            log.exception("request %s failed in postprocess", seq.id)
            self._fail(seq, exc)

    def select(self, seq: Sequence, logits: np.ndarray, mask: np.ndarray | None = None) -> int:
        """Logits processors, then the grammar mask, then sampling: the token this sequence takes next."""
        p = seq.params
        raw = logits
        if len(seq.output_ids) < p.min_tokens or p.ignore_eos:
            logits = logits.copy()
            logits[list(self.eos)] = -np.inf
        elif p.edits_logits or seq.guide:
            logits = logits.copy()
        logits = apply_penalties(logits, p, seq.prompt_ids, seq.counts)
        if seq.guide is not None:
            if mask is None:  # after prefill: this row's mask alone
                mask = self._one_mask[0]
                seq.guide.compute_mask(mask)
            apply_mask(logits, mask)
            if not np.isfinite(logits).any():  # the grammar allows only the end (min_tokens gives way)
                logits[next(iter(self.eos))] = 0.0
        token = sample(logits, p, seq.rng)
        if p.logprobs is not None and token not in self.eos:
            seq.logprobs.append(token_logprobs(raw, token, p.logprobs))
        return token

    def _advance(self, seq: Sequence, token: int) -> None:
        """Take ``token``: stream its text, or finish on EOS, a stop string, max_tokens or the context."""
        if token in self.eos:
            self._finish(seq, "stop")
            return
        if seq.guide is not None:
            seq.guide.consume(token)
        text = seq.accept(token)
        self.total_output_tokens += 1
        if seq.stop.stopped or (seq.guide is not None and seq.guide.stopped):
            self._emit(seq, text)
            self._finish(seq, "stop")
        elif (len(seq.output_ids) >= seq.params.max_tokens
              or len(seq.prompt_ids) + len(seq.output_ids) >= self.runner.spec.context_length):
            self._emit(seq, text)
            self._finish(seq, "length")
        elif text:
            self._emit(seq, text, [token])

    def _emit(self, seq: Sequence, text: str, ids: list[int] | None = None) -> None:
        seq.sink(TokenEvent(request_id=seq.id, text=text, token_ids=ids or [], logprobs=self._take_logprobs(seq)))

    @staticmethod
    def _take_logprobs(seq: Sequence) -> list[tuple[int, float, list[tuple[int, float]]]] | None:
        if seq.params.logprobs is None:
            return None
        out, seq.logprobs = seq.logprobs, []
        return out

    def _finish(self, seq: Sequence, reason: str, error: str | None = None, code: str | None = None) -> None:
        if seq.finished:
            return
        text = seq.tail() if reason in ("stop", "length") else ""
        seq.finished = True
        self.faults.pop(seq.id, None)
        seq.sink(TokenEvent(request_id=seq.id, text=text, finished=True, finish_reason=reason,
                            metrics=seq.metrics(), error=error, error_code=code, logprobs=self._take_logprobs(seq)))

    def _fail(self, seq: Sequence, exc: BaseException) -> None:
        self.failed_rows += 1
        log.warning("request %s failed alone: %s: %s", seq.id, type(exc).__name__, exc)
        self._finish(seq, "error", error=f"generation failed: {type(exc).__name__}: {exc}")

    # ---- retire -----------------------------------------------------------
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
        p = self.prefilling
        if p is not None and p.finished:
            self.runner.clear(p.row)
            self.prefilling = None
        elif p is not None and p.row != len(self.running):  # keep it right after the decoding rows
            self.runner.move(p.row, len(self.running))
            p.row = len(self.running)

    def _apply_aborts(self, ids: set[str]) -> None:
        if not ids:
            return
        with self._cond:
            queued = [s for s in self.waiting if s.id in ids]
            for s in queued:
                self.waiting.remove(s)
        active = self.running + ([self.prefilling] if self.prefilling else [])
        for s in queued + [s for s in active if s.id in ids and not s.finished]:
            s.aborted = True
            self._finish(s, "abort")
        self._retire_finished()

    def fail_all(self, message: str, code: str | None = None) -> None:
        """End every request, running and queued, with ``message`` (a broken loop, a restart)."""
        with self._cond:
            queued = list(self.waiting)
            self.waiting.clear()
        active = self.running + ([self.prefilling] if self.prefilling else [])
        for s in active + queued:
            try:
                self._finish(s, "error", error=message, code=code)
            except Exception:  # a sink that cannot take the event: nothing more to tell it
                log.exception("could not deliver the error to %s", s.id)
        self.running.clear()
        self.prefilling = None
        self.runner.lengths[:] = 0

    def _release_idle_memory(self) -> None:
        """Idle after long or many sequences: shrink the KV cache and hand the pages back."""
        if self.runner.capacity > IDLE_CAPACITY or self.runner.rows > 1:
            self.runner.shrink(IDLE_CAPACITY)
            trim_heap()


# glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
HEAP_ARENAS = 2                  # malloc arenas for the whole process
HEAP_MMAP_THRESHOLD = 256 << 10  # allocations from this size up get their own mapping


def tune_heap() -> bool:
    """Make a long-running server's RSS follow what it really holds (Linux/glibc; call it before
    the model loads, so threads created later share the few arenas).

    * Few arenas: glibc gives threads up to 8 x cores arenas of 64 MB; the engine thread, ONNX
      Runtime's workers and the event loop each fragment their own, and a soak's RSS crept up
      for minutes as each reached its own high-water mark (16 streams: a 590 MB plateau with
      6 arenas, 460 MB with 2, measured with benchmarks/soak.py).
    * A fixed mmap threshold: glibc raises its threshold to the largest block ever freed (up
      to 32 MB), after which KV buffers and other large arrays come from the heap and stay there
      when freed. Fixed at 256 KB, they are mapped and unmapped (a decode step allocates nothing
      that large; the KV cache and ONNX Runtime's arena are allocated rarely).

    A user's own ``MALLOC_ARENA_MAX`` / ``MALLOC_MMAP_THRESHOLD_`` win. Returns whether it applied.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        done = False
        if "MALLOC_ARENA_MAX" not in os.environ:
            done = bool(libc.mallopt(_M_ARENA_MAX, HEAP_ARENAS)) or done
        if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            done = bool(libc.mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)) or done
        return done
    except (OSError, AttributeError):  # not glibc (musl): nothing to tune
        return False


def trim_heap() -> None:
    """Ask glibc to return freed heap pages to the system (numpy buffers under the mmap threshold
    stay in the heap otherwise, and RSS never comes down)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
