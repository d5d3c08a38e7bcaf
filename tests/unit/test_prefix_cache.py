"""Prefix reuse policy without a model: matching, eviction, byte accounting, and the
scheduler's choices (engine/prefix_cache.py, engine/scheduler.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.engine.detokenize import IncrementalDetokenizer
from ortserve.engine.prefix_cache import PrefixCache, common_prefix
from ortserve.engine.scheduler import MIN_REUSE, Scheduler
from ortserve.engine.sequence import Sequence
from ortserve.types import SamplingParams

BPT = 10  # bytes per token


def seq(tokens: list[int], name: str = "s", max_tokens: int = 4) -> Sequence:
    return Sequence(id=name, prompt_ids=list(tokens), params=SamplingParams(max_tokens=max_tokens),
                    sink=lambda ev: None, detok=IncrementalDetokenizer(lambda ids: ""), model="m")


def tokens(*parts: range | list[int]) -> np.ndarray:
    return np.concatenate([np.asarray(list(p)) for p in parts])


def scheduler(budget: int, cache: PrefixCache | None = None, lengths: dict[int, int] | None = None) -> Scheduler:
    lengths = lengths if lengths is not None else {}
    return Scheduler(slots=4, context_length=10_000, bytes_per_token=BPT, kv_budget=budget,
                     row_length=lambda row: lengths.get(row, 0), cache=cache)


def test_common_prefix() -> None:
    a = np.arange(10)
    assert common_prefix(a, a) == 10
    assert common_prefix(a, a[:4]) == 4
    assert common_prefix(a, np.array([0, 1, 9])) == 2
    assert common_prefix(a, np.array([5])) == 0
    assert common_prefix(a, np.array([], dtype=np.int64)) == 0


def test_the_longest_partial_match_wins_and_bytes_are_exact() -> None:
    cache = PrefixCache()
    sys_prompt = range(100)
    a = cache.add(tokens(sys_prompt, [500, 501]), block="A", nbytes=102 * BPT)
    b = cache.add(tokens(sys_prompt, [600, 601, 602]), block="B", nbytes=103 * BPT)
    assert cache.nbytes == 205 * BPT
    # an edited conversation: the system prompt and the first turn still match
    assert cache.match(tokens(sys_prompt, [600, 601, 7, 8])) == (b, 102)
    assert cache.match(tokens(sys_prompt, [500, 9])) == (a, 101)
    assert cache.match(np.array([42, 1, 2])) == (None, 0)


def test_an_entry_that_extends_another_replaces_it() -> None:
    cache = PrefixCache()
    turn1 = tokens(range(50))
    cache.add(turn1, "T1", 50 * BPT)
    turn2 = tokens(range(50), [90, 91, 92])  # the next turn resends turn 1 and adds to it
    assert cache.covers(turn1[:30]) is not None and cache.covers(turn2) is None
    e2 = cache.add(turn2, "T2", 53 * BPT)
    assert cache.entries == [e2] and cache.nbytes == 53 * BPT
    assert cache.evictions == 0  # replaced, not evicted for room


def test_lru_eviction_spares_the_entry_in_use() -> None:
    cache = PrefixCache()
    old = cache.add(np.arange(10), "old", 100)
    mid = cache.add(np.arange(100, 110), "mid", 100)
    new = cache.add(np.arange(200, 210), "new", 100)
    cache.touch(old)  # used again: now the most recent
    assert cache.evict_lru() and cache.entries == [old, new] and mid.block is None
    assert cache.evict_lru(keep=new) and cache.entries == [new]
    assert not cache.evict_lru(keep=new)  # the entry being reused is never the one dropped
    assert cache.nbytes == 100 and cache.evictions == 2
    cache.clear()
    assert cache.nbytes == 0 and not cache.entries


def test_cached_prefixes_are_freed_before_a_running_sequence_is_preempted() -> None:
    cache = PrefixCache()
    lengths = {0: 40, 1: 40}
    s = scheduler(budget=100 * BPT, cache=cache, lengths=lengths)
    a, b = seq(range(40), "a"), seq(range(1000, 1040), "b")
    a.row, b.row, a.started_at, b.started_at = 0, 1, 1.0, 2.0
    s.running = [a, b]
    cache.add(np.arange(5000, 5015), "x", 15 * BPT)
    cache.add(np.arange(6000, 6015), "y", 15 * BPT)
    # 2 rows x 41 tokens = 82 fit only once the cache gives back at least 12 tokens' worth
    assert s.next_victim() is None
    assert cache.evictions == 1 and cache.nbytes == 15 * BPT
    lengths[0] = lengths[1] = 49  # 2 x 50 = 100: the cache must be empty, then it fits exactly
    assert s.next_victim() is None and cache.nbytes == 0
    lengths[0] = lengths[1] = 50  # now only a preemption helps: the newest goes
    assert s.next_victim() is b


def test_reuse_leaves_a_token_to_prefill_and_prefers_a_running_row_on_a_tie() -> None:
    cache = PrefixCache()
    s = scheduler(budget=10**9, cache=cache)
    prompt = list(range(60))
    entry = cache.add(np.arange(60), "E", 60 * BPT)
    r = s.reuse_for(seq(prompt))
    assert r is not None and r.entry is entry and r.tokens == 59  # its logits need one token run
    running = seq(prompt, "r")
    running.row, running.output_ids = 0, [7, 8]
    s.row_length = lambda row: 61  # the prompt and its first output token
    s.running = [running]
    r = s.reuse_for(seq(prompt + [7, 8, 9]))
    assert r is not None and r.row == 0 and r.entry is None and r.tokens == 61
    assert s.reuse_for(seq(list(range(MIN_REUSE - 1)) + [999])) is None  # too short to bother
    assert scheduler(budget=10**9).reuse_for(seq(prompt)) is None  # the cache is off


@pytest.mark.parametrize("reason, kept", [("stop", True), ("length", True), ("abort", True),
                                          ("error", False), (None, False)])
def test_only_sequences_that_finished_whole_are_kept(reason: str | None, kept: bool) -> None:
    cache = PrefixCache()
    s = scheduler(budget=10**9, cache=cache)
    done = seq(range(30))
    done.reason = reason  # None: preempted, or still prefilling
    assert s.worth_keeping(done, np.arange(30), in_use=0) is kept


def test_keeping_a_prefix_evicts_older_ones_within_the_budget() -> None:
    cache = PrefixCache()
    s = scheduler(budget=100 * BPT, cache=cache)
    done = seq(range(40))
    done.reason = "stop"
    cache.add(np.arange(1000, 1030), "old", 30 * BPT)
    assert s.worth_keeping(done, np.arange(40), in_use=40 * BPT)  # 40 in rows + 30 + 40 > 100: old goes
    assert cache.nbytes == 0 and cache.evictions == 1
    assert not s.worth_keeping(done, np.arange(40), in_use=70 * BPT)  # no room even with an empty cache
    cache.add(np.arange(40), "same", 40 * BPT)
    assert not s.worth_keeping(done, np.arange(20), in_use=0)  # already held whole: nothing to add


def test_admission_evicts_the_prefix_it_would_reuse_only_as_a_last_resort() -> None:
    cache = PrefixCache()
    s = scheduler(budget=100 * BPT, cache=cache, lengths={0: 50})
    first = seq(range(2000, 2050), "first")
    first.row = 0
    s.running = [first]
    hit = cache.add(np.arange(40), "hit", 40 * BPT)
    cache.add(np.arange(3000, 3020), "other", 20 * BPT)
    s.waiting.append(seq(list(range(40)) + [1, 2], "new", max_tokens=1))  # wants 42 + 1 + 1 tokens
    # 2 rows x 51 = 102 > 100 even with an empty cache: it waits, and the cache keeps all it holds
    assert s.admit_next() is None and cache.nbytes == 60 * BPT
    s.running = []
    admitted = s.admit_next()  # alone: 44 tokens + the 40 cached fit once "other" goes
    assert admitted is not None
    new, reuse = admitted
    assert new.id == "new" and new.row == 0 and reuse is not None and reuse.entry is hit and reuse.tokens == 40
    assert cache.entries == [hit]
    s.waiting.append(seq(list(range(40)) + list(range(9000, 9040)), "big", max_tokens=1))
    admitted = s.admit_next()  # 82 + 40 > 100: its own prefix goes too, and it starts from nothing
    assert admitted is not None and admitted[0].id == "big" and admitted[1] is None and cache.nbytes == 0
