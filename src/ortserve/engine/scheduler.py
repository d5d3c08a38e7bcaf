"""The scheduler: who runs this step. Policy only: it sees sequences, token counts and bytes,
never a tensor, and it calls no model (as nano-vllm's ``scheduler.py``).

Each step the core asks it, in this order:

* ``next_victim()``: while decode growth would pass the KV budget, the newest sequence to
  preempt (it is re-admitted later by recomputing its prefix, so its tokens do not change).
  Cached prefixes are evicted first: a running sequence is preempted only when the prefix
  cache holds nothing more to give back.
* ``plan()``: the decode batch, and how many prompt tokens this step may prefill. While
  sequences decode, the chunk is held to a time budget, ``prefill_ratio`` x the measured
  decode step, converted to tokens with the measured prefill cost per token, so a step with
  a chunk takes about ``1 + prefill_ratio`` decode steps on any hardware or load.
* ``admit_next()``: the next waiting sequence, while a KV row and the budget allow, with the
  KV it can start from (``Reuse``): the longest prefix of its tokens already held by a cached
  prefix (engine/prefix_cache.py) or by a running sequence's row. The core copies that KV
  into the new row and prefills only the rest.

The core carries out every decision on the runner (engine/core.py).
"""

from __future__ import annotations

import collections
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortserve.engine.prefix_cache import Entry, PrefixCache, common_prefix
from ortserve.engine.sequence import Sequence

# Decode tokens reserved at admission beyond the prefix. Reserving all of max_tokens would
# leave most of the budget idle (answers usually stop early); past this, growth preempts.
ADMIT_HEADROOM = 16
MIN_CHUNK = 16  # the time budget never cuts a prompt chunk below this many tokens
RECENT = 16     # the budget uses the median of this many recent decode steps and prompt chunks
MIN_REUSE = 8   # shorter shared prefixes are prefilled: a copy would save next to nothing
KEEP = ("stop", "length", "abort")  # finish reasons whose KV rows are whole: worth keeping as prefixes


@dataclass
class Plan:
    """What one step runs: prompt chunks to prefill, then one decode step over ``decode``."""

    decode: list[Sequence] = field(default_factory=list)
    prefill_budget: int = 0


@dataclass(frozen=True)
class Reuse:
    """KV a new sequence starts from: the first ``tokens`` of a cached ``entry`` or of ``row``."""

    tokens: int
    entry: Entry | None = None
    row: int | None = None


class Delegated:
    """A scheduler attribute read and set through its owner's ``scheduler`` (the engine core keeps
    its old names: tests and benchmarks tune ``chunk_tokens``, ``prefill_ratio`` and ``kv_budget``
    there, and watch the queues)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, core: Any, owner: type | None = None) -> Any:
        return self if core is None else getattr(core.scheduler, self.name)

    def __set__(self, core: Any, value: Any) -> None:
        setattr(core.scheduler, self.name, value)


class Scheduler:
    def __init__(self, *, slots: int, context_length: int, bytes_per_token: int, kv_budget: int,
                 row_length: Callable[[int], int], chunk_tokens: int = 512, prefill_ratio: float = 0.0,
                 cache: PrefixCache | None = None, lock: threading.Condition | None = None) -> None:
        self.slots = slots
        self.context_length = context_length
        self.bytes_per_token = bytes_per_token
        self.kv_budget = kv_budget
        self.row_length = row_length  # tokens held in a KV row (read from the runner)
        self.chunk_tokens = max(1, chunk_tokens)
        self.prefill_ratio = prefill_ratio  # 0: chunks of chunk_tokens only, no time budget
        self.cache = cache  # None: prefix reuse off
        self.lock = lock or threading.Condition()  # guards ``waiting`` (requests arrive from other threads)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []        # decoding, rows 0..d-1
        self.prefilling: Sequence | None = None  # being prefilled in chunks, row d
        # measured: a step's time outside prefill, and prefill time per prompt token. Medians, not
        # means: one step stretched by the OS (a busy machine) must not inflate the budget
        self._step_times: collections.deque[float] = collections.deque(maxlen=RECENT)
        self._token_times: collections.deque[float] = collections.deque(maxlen=RECENT)

    # ---- the KV budget ------------------------------------------------------
    def fits(self, rows: int, tokens: int) -> bool:
        """Whether ``rows`` KV rows of ``tokens`` tokens stay within the whole KV budget."""
        return rows * tokens * self.bytes_per_token <= self.kv_budget

    def make_room(self, rows: int, tokens: int, keep: Entry | None = None) -> bool:
        """Whether ``rows`` rows of ``tokens`` fit beside the prefix cache, evicting cached
        prefixes (least recently used first, never ``keep``) until they do."""
        need = rows * tokens * self.bytes_per_token
        cache = self.cache
        while cache is not None and need + cache.nbytes > self.kv_budget and cache.evict_lru(keep):
            pass
        return need + (cache.nbytes if cache is not None else 0) <= self.kv_budget

    def worth_keeping(self, seq: Sequence, tokens: np.ndarray, in_use: int) -> bool:
        """Whether a retiring sequence's row (holding ``tokens``) should be copied into the prefix
        cache, evicting older prefixes for the room; ``in_use``: the bytes the runner's rows hold.
        Only a sequence that finished whole is kept (never one that failed, or ended mid-prefill)."""
        cache = self.cache
        if cache is None or seq.reason not in KEEP or len(tokens) < MIN_REUSE:
            return False
        held = cache.covers(tokens, seq.adapter)
        if held is not None:  # nothing new in it
            cache.touch(held)
            return False
        nbytes = len(tokens) * self.bytes_per_token
        while in_use + cache.nbytes + nbytes > self.kv_budget and cache.evict_lru():
            pass
        return in_use + cache.nbytes + nbytes <= self.kv_budget

    @property
    def runner_limit(self) -> int:
        """The bytes the runner's KV rows may grow to: the budget less what the cache holds."""
        return self.kv_budget - (self.cache.nbytes if self.cache is not None else 0)

    # ---- preemption -----------------------------------------------------------
    def next_victim(self) -> Sequence | None:
        """The sequence to preempt before this step, or None when decode growth fits."""
        if not self.running and not self.prefilling:
            return None
        rows = len(self.running) + (self.prefilling is not None)
        need = max([self.row_length(s.row) + 1 for s in self.running]
                   + ([len(self.prefilling.prefix())] if self.prefilling else []))
        if self.make_room(rows, need) or rows == 1:
            return None
        candidates = self.running + ([self.prefilling] if self.prefilling else [])
        return max(candidates, key=lambda s: s.started_at or 0.0)

    def requeue(self, victim: Sequence) -> None:
        """A preempted sequence goes back to the head of the queue (the core freed its row)."""
        with self.lock:
            self.waiting.appendleft(victim)  # first to come back

    # ---- the step's plan --------------------------------------------------------
    def plan(self) -> Plan:
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
        if not self.running or self.prefill_ratio <= 0:  # before the medians: a plain decode step needs none
            return self.chunk_tokens
        step, per_token = self.step_seconds, self.prefill_token_seconds
        if not step or not per_token:
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

    def record_step(self, seconds: float) -> None:
        self._step_times.append(seconds)

    def record_chunk(self, seconds: float, tokens: int) -> None:
        self._token_times.append(seconds / tokens)

    # ---- admission ------------------------------------------------------------
    def admit_next(self) -> tuple[Sequence, Reuse | None] | None:
        """The next waiting sequence into row d, if a row and the KV budget allow, and the KV it
        may start from."""
        with self.lock:
            if not self.waiting or len(self.running) >= self.slots:
                return None
            seq = self.waiting[0]
            reuse = self.reuse_for(seq)
            need = [self.row_length(s.row) + 1 for s in self.running]
            # room for its prefix plus some decode growth, next to what already runs
            want = min(len(seq.prefix()) + 1 + min(seq.params.max_tokens, ADMIT_HEADROOM), self.context_length)
            rows, tokens = len(self.running) + 1, max(need + [want])
            if self.running and not self.fits(rows, tokens):
                return None  # it waits for running sequences to finish (alone it fits: engine.prepare)
            if not self.make_room(rows, tokens, keep=reuse.entry if reuse else None):
                self.make_room(rows, tokens)  # then without the prefix it would have started from
                reuse = self.reuse_for(seq)
            self.waiting.popleft()
        seq.row = len(self.running)
        seq.cached = 0
        return seq, reuse

    def reuse_for(self, seq: Sequence) -> Reuse | None:
        """The longest prefix of ``seq``'s tokens held by a cached prefix or a running row (at
        least one token is left to prefill: its logits give the first output token)."""
        if self.cache is None:
            return None
        tokens = np.asarray(seq.prefix())
        entry, best = self.cache.match(tokens, seq.adapter)
        row = None
        for s in self.running:
            if s.adapter != seq.adapter:  # never across adapters
                continue
            held = np.asarray((s.prompt_ids + s.output_ids)[:self.row_length(s.row)])
            n = common_prefix(tokens, held)
            if n >= best:  # a tie: the row (no cache block is touched)
                entry, best, row = None, n, s.row
        best = min(best, len(tokens) - 1)
        if best < MIN_REUSE:
            return None
        if entry is not None:
            self.cache.touch(entry)
        return Reuse(tokens=best, entry=entry, row=row)
