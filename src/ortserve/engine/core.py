"""The engine loop, in one thread: schedule -> prefill -> decode -> postprocess -> retire.

Each step the scheduler (engine/scheduler.py) names the sequences to preempt, the decode
batch and how many prompt tokens may be prefilled. The runner prefills, starting each new
sequence from the longest prefix of its tokens whose KV is already held (engine/prefix_cache.py)
and going in chunks between decode steps, then runs one batched decode step; each sequence is
postprocessed on its own (sample, stream text). Finished sequences give back their rows, and
the KV of those that finished whole is kept as a cached prefix until the budget needs the room.

Failures stay with the request that caused them: a batched decode step that raises is
retried row by row to find the culprit, and only that request ends with an error; a
request whose own postprocess raises (sampling, detokenizing, a grammar) fails alone.

Row layout: decoding sequences occupy KV rows ``0..d-1`` (kept compact), and the one
sequence being prefilled in chunks, if any, sits at row ``d``.
"""

from __future__ import annotations

import collections
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ortserve.engine.guidance import Guidance, allocate_masks
from ortserve.engine.heap import trim_heap, tune_heap  # noqa: F401 - server/run.py imports tune_heap here
from ortserve.engine.loop import EngineCrash, EngineThread  # noqa: F401 - EngineCrash: importers
from ortserve.engine.postprocess import Postprocess
from ortserve.engine.prefix_cache import PrefixCache
from ortserve.engine.runner import Runner
from ortserve.engine.scheduler import MIN_CHUNK, RECENT, Delegated, Reuse, Scheduler  # noqa: F401
from ortserve.engine.sequence import Sequence
from ortserve.engine.speculation.speculate import Speculation
from ortserve.types import EngineStats

log = logging.getLogger("ortserve.engine")

IDLE_CAPACITY = 256  # tokens per row kept when idle; more is given back


class EngineCore(Postprocess, Speculation, EngineThread):
    waiting, running, prefilling = Delegated(), Delegated(), Delegated()
    chunk_tokens, prefill_ratio, kv_budget, cache = Delegated(), Delegated(), Delegated(), Delegated()
    _step_times, _token_times = Delegated(), Delegated()
    prefill_tokens_now = Scheduler.prefill_tokens_now
    step_seconds, prefill_token_seconds = Scheduler.step_seconds, Scheduler.prefill_token_seconds

    def __init__(self, runner: Runner, *, chunk_tokens: int = 512, prefill_ratio: float = 0.0,
                 kv_budget_bytes: int | None = None, guidance: Guidance | None = None,
                 prefix_cache: bool = True, speculative: bool = False, speculative_k: int = 4) -> None:
        self.runner, self.speculative, self.speculative_k = runner, speculative, speculative_k
        self.guidance = guidance  # grammar masks for constrained sequences (engine/guidance.py)
        self._masks = allocate_masks(runner.slots, runner.spec.vocab_size)
        self._one_mask = allocate_masks(1, runner.spec.vocab_size)
        self._mask_pool: ThreadPoolExecutor | None = None
        self.mask_seconds = 0.0  # time the loop waited for grammar masks after a decode step
        self.eos = set(runner.spec.eos_token_ids)
        super().__init__()
        self.scheduler = Scheduler(slots=runner.slots, context_length=runner.spec.context_length,
                                   bytes_per_token=runner.bytes_per_token,
                                   kv_budget=kv_budget_bytes or (1 << 62),
                                   row_length=lambda row: int(runner.lengths[row]), chunk_tokens=chunk_tokens,
                                   prefill_ratio=prefill_ratio, lock=self._cond,
                                   cache=PrefixCache() if prefix_cache else None)
        runner.byte_limit = self.kv_budget
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self.total_requests = 0
        self.total_output_tokens = 0
        self.prefill_tokens = 0  # prompt tokens computed
        self.reused_tokens = 0   # prompt tokens copied from KV already held instead
        self.prefill_seconds = 0.0
        self.decode_tokens = 0
        self.decode_seconds = 0.0
        self.preemptions = 0
        self.failed_rows = 0

    # ---- thread-safe API (and engine/loop.py) --------------------------------
    def add(self, seq: Sequence) -> None:
        with self._cond:
            self.waiting.append(seq)
            self.total_requests += 1
            self._cond.notify()

    def fits(self, rows: int, tokens: int) -> bool:
        """Whether ``rows`` KV rows of ``tokens`` tokens stay within the KV budget."""
        return self.scheduler.fits(rows, tokens)

    def stats(self) -> EngineStats:
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self._recent) if now - t < 5.0]
        tps = sum(n for _, n in recent) / 5.0 if recent else 0.0
        busy = sum(not s.finished for s in list(self.running)) + (self.prefilling is not None)
        c = self.cache if self.cache is not None else PrefixCache()  # off: zeros
        return EngineStats(running=busy, waiting=len(self.waiting), tokens_per_second=tps,
                           total_requests=self.total_requests, total_output_tokens=self.total_output_tokens,
                           prompt_tokens_computed=self.prefill_tokens, prompt_tokens_reused=self.reused_tokens,
                           prefix_cache_bytes=c.nbytes, prefix_cache_entries=len(c.entries), prefix_cache_evictions=c.evictions,
                           speculative_proposed=self.spec_proposed, speculative_accepted=self.spec_accepted)

    # ---- the step ---------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling)

    def step(self) -> None:
        t0 = time.perf_counter()
        while (victim := self.scheduler.next_victim()) is not None:
            self._preempt(victim)
        self.runner.byte_limit = self.scheduler.runner_limit  # the rows may grow into what the cache gave back
        plan = self.scheduler.plan()
        prefilled = self.prefill_seconds
        self._prefill(plan.prefill_budget)
        prefilled = self.prefill_seconds - prefilled
        if plan.decode:
            if not self._speculate(plan.decode):  # one sequence with guesses: a verify step instead
                self._decode(plan.decode)
            self.scheduler.record_step(time.perf_counter() - t0 - prefilled)
        self._retire_finished()
        if not self.running and not self.prefilling and not self.waiting:
            self._release_idle_memory()

    # ---- schedule ---------------------------------------------------------
    def _preempt(self, victim: Sequence) -> None:
        log.info("KV budget full: preempting %s (%d tokens), it resumes later", victim.id, victim.cached)
        self.preemptions += 1
        victim.preempted += 1
        victim.cached = 0
        victim.finished = True  # retire its row now
        self._retire_finished()
        victim.finished = False
        victim.row = -1
        self.scheduler.requeue(victim)

    def _admit_next(self) -> Sequence | None:
        """The next waiting sequence into row d, starting from the KV it can reuse."""
        admitted = self.scheduler.admit_next()
        if admitted is None:
            return None
        seq, reuse = admitted
        if self.fault is not None:  # tests: the next scheduled sequence carries the fault
            self.plant_fault(seq.id, self.fault)
            self.fault = None
        if seq.started_at is None:
            seq.started_at = time.perf_counter()
        self.runner.use_adapter(seq.row, seq.adapter)  # its LoRA adapter's index in the row's input
        self.runner.byte_limit = self.scheduler.runner_limit
        if reuse is not None:
            self._reuse(seq, reuse)
        return seq

    def _reuse(self, seq: Sequence, reuse: Reuse) -> None:
        """Start ``seq`` from KV already computed: a cached prefix's, or a running row's."""
        if reuse.entry is not None:
            self.runner.load(seq.row, reuse.entry.block, reuse.tokens, total=len(seq.prefix()))
        elif reuse.row is not None:
            self.runner.copy_prefix(reuse.row, seq.row, reuse.tokens, total=len(seq.prefix()))
        seq.cached = reuse.tokens
        self.reused_tokens += reuse.tokens
        if not seq.preempted:  # what its usage reports: prompt tokens it did not compute
            seq.reused = min(reuse.tokens, len(seq.prompt_ids))

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
                self.check_fault(seq.id, "step")
                logits = self.runner.prefill(seq.row, prefix[start:end], start=start, total=len(prefix))
            except Exception as exc:  # noqa: BLE001 - whatever a kernel raises ends this request only
                self.prefilling = None
                self._fail(seq, exc)
                self.runner.clear(seq.row)
                continue
            spent = time.perf_counter() - t0
            self.prefill_seconds += spent
            self.prefill_tokens += end - start
            self.scheduler.record_chunk(spent, end - start)
            budget -= end - start
            seq.cached = end
            if not last:
                return  # the rest in the next steps, between decode steps
            self.prefilling = None
            self.running.append(seq)
            # The step's budget was planned before this sequence decoded; from now on a stream runs
            # beside the rest of the prefill, so the time budget holds for what is left of the step.
            budget = min(budget, self.scheduler.prefill_tokens_now())
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
                self.check_fault(s.id, "step")
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
                self.check_fault(seq.id, "step")
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

    # ---- retire -----------------------------------------------------------
    def _retire_finished(self) -> None:
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if seq.finished:
                self._remember(seq)
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

    def _remember(self, seq: Sequence) -> None:
        """Keep a finished sequence's KV as a cached prefix, when the scheduler finds it worth the room."""
        n = int(self.runner.lengths[seq.row])
        tokens = np.asarray((seq.prompt_ids + seq.output_ids)[:n])
        if self.cache is not None and self.scheduler.worth_keeping(seq, tokens, in_use=self.runner.nbytes):
            self.cache.add(tokens, self.runner.save(seq.row), n * self.runner.bytes_per_token, seq.adapter)
            self.runner.byte_limit = self.scheduler.runner_limit

    def apply_aborts(self, ids: set[str]) -> None:
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
