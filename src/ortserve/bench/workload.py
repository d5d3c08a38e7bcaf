"""What every backend is asked to do: prompt lengths x batch sizes, fixed greedy generation length.

Defaults follow the ADR (docs seed 003): prompts of 16..2048 tokens, 256 generated tokens,
5 warm-up runs and 10 measured repetitions, batches of 1, 4, 8 and 16. Generation ignores EOS
so that every backend produces exactly ``gen_tokens`` tokens per request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PROMPT_LENGTHS = (16, 64, 256, 1024, 2048)
BATCH_SIZES = (1, 4, 8, 16)


@dataclass(frozen=True)
class Workload:
    prompt_lengths: tuple[int, ...] = PROMPT_LENGTHS
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    gen_tokens: int = 256
    warmup: int = 5
    reps: int = 10
    grid: bool = False  # every (batch, prompt) pair, instead of two sweeps

    @classmethod
    def quick(cls) -> Workload:
        return cls(prompt_lengths=(16,), batch_sizes=(1, 4), gen_tokens=16, warmup=1, reps=2)

    def capped(self, context_length: int) -> Workload:
        """Drop prompt lengths that do not fit the context window with the generated tokens."""
        fits = tuple(n for n in self.prompt_lengths if n + self.gen_tokens <= context_length)
        return Workload(fits, self.batch_sizes, self.gen_tokens, self.warmup, self.reps, self.grid)

    def cells(self, batches: bool) -> list[tuple[int, int]]:
        """(batch size, prompt length) pairs to run, in order of growing cost.

        By default a prompt-length sweep at batch 1 plus a batch sweep at the shortest prompt
        (the ADR's two tables); ``grid`` runs every pair. Backends that cannot batch get batch 1.
        """
        sizes = [b for b in self.batch_sizes if batches or b == 1] or ([1] if not batches else [])
        if self.grid:
            return [(b, n) for b in sizes for n in self.prompt_lengths]
        cells = [(1, n) for n in self.prompt_lengths if 1 in sizes or not batches]
        if self.prompt_lengths:
            shortest = min(self.prompt_lengths)
            cells += [(b, shortest) for b in sizes if b != 1]
        return cells

    def runs(self) -> int:
        return self.warmup + self.reps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Prompt:
    ids: list[int]
    text: str


@dataclass
class PromptSet:
    """Distinct prompts per length, so no run can reuse another run's KV cache or prefix."""

    by_length: dict[int, list[Prompt]] = field(default_factory=dict)

    def get(self, length: int, index: int) -> Prompt:
        pool = self.by_length[length]
        return pool[index % len(pool)]

    def to_json(self) -> dict[str, Any]:
        return {str(n): [[p.ids, p.text] for p in ps] for n, ps in self.by_length.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PromptSet:
        return cls({int(n): [Prompt(list(i), t) for i, t in ps] for n, ps in data.items()})


def build_prompts(tokenizer_json: Path, workload: Workload, text: str, max_batch: int) -> PromptSet:
    """Prompts of exactly n tokens cut from ``text`` at different offsets.

    Each prompt's text re-encodes to its ids, so text-in backends (engine, server) and ids-in
    backends (og, transformers) see the same tokens.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    base = tok.encode(text, add_special_tokens=False).ids
    longest = max(workload.prompt_lengths, default=0)
    source = base * (longest // max(len(base), 1) + 2)
    count = workload.runs() * max_batch
    out: dict[int, list[Prompt]] = {}
    for n in workload.prompt_lengths:
        out[n] = [_exact(tok, source, (j * 37) % max(len(base), 1), n) for j in range(count)]
    return PromptSet(out)


def _exact(tok: Any, source: list[int], start: int, n: int) -> Prompt:
    ids = source[start:start + n]
    for _ in range(4):
        text = tok.decode(ids, skip_special_tokens=True)
        again = tok.encode(text, add_special_tokens=False).ids
        if len(again) == n:
            return Prompt(again, text)
        ids = (again + source[start + n:start + 2 * n])[:n]
    return Prompt(again, text)  # off by a token or two at worst; input_tokens records the truth
