"""The prefix cache: finished sequences' KV, kept to start later prompts that share a prefix.

An agent resends its whole conversation every turn, a RAG app its instructions with every
question, and 16 agents of one app share one system prompt. When a sequence finishes, its
KV row (prompt and answer, exactly the tokens the row holds) is copied out into an
``Entry``; a new request starts from the entry, or the running row, that shares the longest
token prefix with its prompt (a partial match counts: an edited conversation reuses what
still matches), and only the rest is prefilled (engine/scheduler.py decides, engine/core.py
copies).

Why whole-row copies, not vLLM's hashed blocks or SGLang's radix tree: the runner keeps
every sequence's KV in one contiguous row (engine/runner.py), so a decode step is one
batched call over rows ``0..n-1``, and attention reads a row, not a block table. Sharing
blocks in place would need paged attention, which the exported GroupQueryAttention graph
does not have. A copy is cheap next to what it saves: copying a token's KV moves
``bytes_per_token`` bytes (46 KB on SmolLM2-135M, microseconds), prefilling it runs the
whole model (about a millisecond on 2 cores), so reuse wins by three orders of magnitude.
Entries are looked up by a linear scan with numpy: a server holds tens to hundreds of
entries, and comparing a few thousand token ids against each costs microseconds; a trie
would buy nothing at that size.

What is kept, and why it is safe:

* only sequences that finished after their prefill completed (stop, length, or aborted
  while decoding): their rows hold exactly the KV of their tokens. A sequence aborted or
  failed mid-prefill, or one that failed at all, is never kept, so no half-written prefix
  can be matched. Grammar state lives in the sequence, never here.
* an entry that is a prefix of a newer one is dropped (the newer one serves every request
  the older one could), and a new entry that is a prefix of a kept one is not added.
* memory: the entries' bytes count against the same KV budget (``kv_cache_mb``) as the
  running rows. The scheduler evicts entries, least recently used first, whenever running
  or admitted sequences need the room, before it preempts anything.
* a watchdog restart makes a new engine core, and with it an empty cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading token ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


@dataclass(eq=False)
class Entry:
    """One cached prefix: its token ids, its KV (opaque here: engine/kvcache.py made it) and size."""

    tokens: np.ndarray
    block: Any
    nbytes: int
    adapter: str = ""  # the LoRA adapter its KV was computed with (engine/lora.py); "" = the base
    used: int = 0  # LRU clock: higher is more recent


class PrefixCache:
    """Cached prefixes with their exact byte count; bookkeeping only, the KV blocks are opaque."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.nbytes = 0
        self.evictions = 0
        self._clock = count(1)

    def match(self, tokens: np.ndarray, adapter: str = "") -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``tokens``, and that prefix's length. Only
        entries of the same adapter match: another adapter's KV differs from the first token."""
        best, n = None, 0
        for e in self.entries:
            if e.adapter != adapter:
                continue
            m = common_prefix(tokens, e.tokens)
            if m > n:
                best, n = e, m
        return best, n

    def touch(self, entry: Entry) -> None:
        entry.used = next(self._clock)

    def covers(self, tokens: np.ndarray, adapter: str = "") -> Entry | None:
        """A kept entry (of the same adapter) that already holds all of ``tokens`` (nothing new to add)."""
        for e in self.entries:
            if e.adapter == adapter and len(e.tokens) >= len(tokens) and common_prefix(tokens, e.tokens) == len(tokens):
                return e
        return None

    def add(self, tokens: np.ndarray, block: Any, nbytes: int, adapter: str = "") -> Entry:
        """Keep ``block`` as the KV of ``tokens``; entries (of the same adapter) it extends are dropped."""
        for e in [e for e in self.entries if e.adapter == adapter and len(e.tokens) <= len(tokens)
                  and common_prefix(tokens, e.tokens) == len(e.tokens)]:
            self._drop(e)
        entry = Entry(tokens=tokens, block=block, nbytes=nbytes, adapter=adapter)
        self.touch(entry)
        self.entries.append(entry)
        self.nbytes += nbytes
        return entry

    def evict_lru(self, keep: Entry | None = None) -> bool:
        """Drop the least recently used entry but ``keep``; False when there is none."""
        others = [e for e in self.entries if e is not keep]
        if not others:
            return False
        self._drop(min(others, key=lambda e: e.used))
        self.evictions += 1
        return True

    def clear(self) -> None:
        for e in list(self.entries):
            self._drop(e)

    def _drop(self, entry: Entry) -> None:
        self.entries.remove(entry)
        self.nbytes -= entry.nbytes
        entry.block = None  # its memory goes back now, even if something still holds the entry
