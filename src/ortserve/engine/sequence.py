"""A request inside the engine: its tokens, sampling state, text state and timings."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ortserve.engine.detokenize import IncrementalDetokenizer, StopMatcher
from ortserve.engine.guidance import Guide
from ortserve.engine.reasoning import ThinkBudget
from ortserve.engine.sampler import make_rng
from ortserve.engine.speculation.speculate import Drafter
from ortserve.types import Metrics, SamplingParams, TokenEvent

Sink = Callable[[TokenEvent], object]  # its return value is ignored (the engine hands events to the loop)


@dataclass(eq=False)
class Sequence:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: Sink
    detok: IncrementalDetokenizer
    model: str
    arrival: float = field(default_factory=time.perf_counter)
    row: int = -1
    output_ids: list[int] = field(default_factory=list)
    counts: dict[int, int] = field(default_factory=dict)
    pending: int = -1               # sampled, emitted, not yet fed to the model
    first_token_at: float | None = None
    started_at: float | None = None
    cached: int = 0                 # tokens of prefix() held in its KV row
    reused: int = 0                 # prompt tokens its KV row started with, copied, not computed
    preempted: int = 0              # times it gave its row back under KV pressure
    aborted: bool = False
    finished: bool = False
    reason: str | None = None       # its finish reason, once finished
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)  # not yet emitted
    guide: Guide | None = None      # grammar state when the output is constrained (engine/guidance.py)
    adapter: str = ""               # the LoRA adapter it runs with, and its scale (engine/lora.py adapter_key); "" = the base
    draft: Drafter | None = None    # its prompt-lookup guesses, once it speculated (engine/speculation/speculate.py)
    think: ThinkBudget | None = None  # a thinking model's reasoning count and budget (engine/reasoning.py)

    def __post_init__(self) -> None:
        self.rng = make_rng(self.params.seed)
        self.stop = StopMatcher(self.params.stop)
        p = self.params
        # greedy, and nothing edits or reads its logits row (penalties, bias, grammar, reasoning budget,
        # logprobs): its pick is the row's argmax, engine/postprocess.py ``select`` takes it without a copy
        self.plain_greedy = (p.greedy and not p.edits_logits and p.logprobs is None
                             and self.guide is None and self.think is None)

    def prefix(self) -> list[int]:
        """The tokens its KV row must hold before the next decode step: the prompt, and after a
        preemption also the outputs so far but the last (still pending, fed by the next decode)."""
        return self.prompt_ids + self.output_ids[:-1] if self.output_ids else self.prompt_ids

    def accept(self, token: int) -> str:
        """Record an output token and return the text it releases (after stop handling)."""
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.output_ids.append(token)
        self.counts[token] = self.counts.get(token, 0) + 1
        self.pending = token
        return self.stop.feed(self.detok.push(token))

    def tail(self) -> str:
        """Text still held back when the sequence ends without a stop string."""
        if self.stop.stopped:
            return ""
        text = self.stop.feed(self.detok.flush())
        return text if self.stop.stopped else text + self.stop.flush()

    def metrics(self) -> Metrics:
        end = time.perf_counter()
        n_out = len(self.output_ids)
        total = end - self.arrival
        ttft = (self.first_token_at - self.arrival) if self.first_token_at is not None else None
        decode_time = end - self.first_token_at if self.first_token_at is not None else 0.0
        return Metrics(
            model=self.model, input_tokens=len(self.prompt_ids), output_tokens=n_out, ttft=ttft,
            tpot=decode_time / (n_out - 1) if n_out > 1 else None, total_latency=total,
            tokens_per_second=n_out / total if total > 0 else 0.0,
            output_tokens_per_second=(n_out - 1) / decode_time if n_out > 1 and decode_time > 0 else 0.0,
            queue_time=(self.started_at or end) - self.arrival, cached_tokens=self.reused,
            speculative=self.draft.stats() if self.draft is not None else None,
            reasoning_tokens=self.think.used if self.think is not None else None)
