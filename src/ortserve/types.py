"""Engine-neutral data types shared by the engine, providers, router, server and CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from ortserve.errors import InvalidRequest

FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. temperature 0 means greedy; top_k 0 means no top-k cut."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    min_tokens: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False
    fit_context: bool = False  # max_tokens is a default: shorten it to the room left in the context
    timeout: float | None = None  # deadline in seconds from submission (queue time counts); None: the server's
    # constrained decoding (at most one): a JSON schema (dict or JSON text), a regex, a Lark grammar
    json_schema: str | None = None
    regex: str | None = None
    grammar: str | None = None
    logprobs: int | None = None  # report each token's log-probability and this many top alternatives
    min_p: float = 0.0               # keep tokens with p >= min_p * p_max (after temperature); 0 = off
    typical_p: float = 1.0           # locally typical sampling mass (Meister et al.); 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]); -100 bans
    speculative: bool = True  # prompt-lookup speculation for this request, where the server has it on
    lora_scale: float | None = None  # the LoRA adapter's scale on alpha/r for this request (docs/lora.md); None: as imported
    # a thinking model's reasoning: at most this many tokens inside its block, then the engine closes it
    # (engine/reasoning.py ThinkBudget); -1 counts them without a bound; None: not tracked
    reasoning_budget: int | None = None

    def __post_init__(self) -> None:
        if self.json_schema is not None and not isinstance(self.json_schema, str):
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        if isinstance(self.logit_bias, Mapping):
            object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        elif not isinstance(self.logit_bias, tuple):
            object.__setattr__(self, "logit_bias", tuple(self.logit_bias))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        self.validate()

    def validate(self) -> None:
        def bad(param: str, why: str) -> InvalidRequest:
            return InvalidRequest(f"'{param}' {why}", param=param)

        if not _finite(self.temperature) or self.temperature < 0 or self.temperature > 2:
            raise bad("temperature", f"must be a number between 0 and 2, got {self.temperature!r}")
        if not _finite(self.top_p) or not (0 < self.top_p <= 1):
            raise bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", f"must be an integer >= 0, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", f"must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if not isinstance(self.speculative, bool):
            raise bad("speculative", f"must be true or false, got {self.speculative!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not (-2**63 <= self.seed < 2**64)):
            raise bad("seed", f"must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if len(self.stop) > 4 or any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "must be up to 4 non-empty strings")
        if not _finite(self.repetition_penalty) or not (0 < self.repetition_penalty <= 10):
            raise bad("repetition_penalty", f"must be in (0, 10], got {self.repetition_penalty!r}")
        if self.lora_scale is not None and (not _finite(self.lora_scale) or not (-10 <= self.lora_scale <= 10)):
            raise bad("lora_scale", f"must be a number between -10 and 10, got {self.lora_scale!r}")
        if self.reasoning_budget is not None and (not isinstance(self.reasoning_budget, int)
                                                  or isinstance(self.reasoning_budget, bool) or self.reasoning_budget < -1):
            raise bad("reasoning_budget", f"must be an integer >= 0 (-1: no bound), got {self.reasoning_budget!r}")
        if self.timeout is not None and (not _finite(self.timeout) or self.timeout <= 0):
            raise bad("timeout", f"must be a number of seconds > 0, got {self.timeout!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite(value) or not (-2 <= value <= 2):
                raise bad(name, f"must be between -2 and 2, got {value!r}")
        constraints = [n for n in ("json_schema", "regex", "grammar") if getattr(self, n) is not None]
        if len(constraints) > 1:
            raise bad(constraints[1], f"cannot be combined with {constraints[0]}: give one constraint")
        for name in constraints:
            if not isinstance(getattr(self, name), str):
                raise bad(name, "must be a string")
        if not _finite(self.min_p) or not (0 <= self.min_p <= 1):
            raise bad("min_p", f"must be in [0, 1], got {self.min_p!r}")
        if not _finite(self.typical_p) or not (0 < self.typical_p <= 1):
            raise bad("typical_p", f"must be in (0, 1], got {self.typical_p!r}")
        if len(self.logit_bias) > 1024:
            raise bad("logit_bias", f"may bias at most 1024 tokens, got {len(self.logit_bias)}")
        for pair in self.logit_bias:
            if (not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], int)
                    or isinstance(pair[0], bool) or pair[0] < 0):
                raise bad("logit_bias", f"keys must be token ids (integers >= 0), got {pair!r}")
            if not _finite(pair[1]) or not (-100 <= pair[1] <= 100):
                raise bad("logit_bias", f"values must be between -100 and 100, got {pair[1]!r} for token {pair[0]}")

    @cached_property
    def bias_arrays(self) -> tuple[Any, Any, Any]:
        """logit_bias as numpy (ids, biases, banned ids) for the sampler, computed once per request."""
        import numpy as np

        ids = np.fromiter((t for t, _ in self.logit_bias), dtype=np.int64, count=len(self.logit_bias))
        vals = np.fromiter((b for _, b in self.logit_bias), dtype=np.float32, count=len(self.logit_bias))
        return ids, vals, ids[vals <= -100]

    @property
    def edits_logits(self) -> bool:
        """Whether the sampler changes the logits row before choosing (so it must work on a copy)."""
        return bool(self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty
                    or self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


SAMPLING_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "repetition_penalty")


@dataclass(frozen=True)
class SamplingDefaults:
    """What the sampling fields a request leaves unset become, and where each value came from
    (``server``: settings; ``model``: the model's generation_config.json or GGUF metadata).
    Fields it has no value for keep SamplingParams' neutral defaults."""

    values: Mapping[str, float | int] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    model_source: str = ""          # which model file the "model" values came from, for `models show`

    def __post_init__(self) -> None:
        unknown = set(self.values) - set(SAMPLING_DEFAULT_FIELDS)
        if unknown:
            raise ValueError(f"not sampling default fields: {sorted(unknown)}")
        SamplingParams(**self.values)  # type: ignore[arg-type]  # raises InvalidRequest naming a bad one

    @classmethod
    def layered(cls, server: Mapping[str, float | int], model: Mapping[str, float | int],
                model_source: str = "") -> SamplingDefaults:
        """The model's own values over the server's."""
        values = {**server, **model}
        sources = {name: "model" if name in model else "server" for name in values}
        return cls(values=values, sources=sources, model_source=model_source if model else "")

    def fill(self, given: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The request's values with the unset (None) ones filled in, and the names filled."""
        out, filled = {}, []
        for name in SAMPLING_DEFAULT_FIELDS:
            if given.get(name) is not None:
                out[name] = given[name]
            elif name in self.values:
                out[name] = self.values[name]
                filled.append(name)
        return out, filled


def _bias_pairs(bias: Mapping[Any, Any]) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id as a string": bias} to sorted (int, float) pairs; a bad key is a 400."""
    pairs = []
    for key, value in bias.items():
        try:
            tid = int(key)
        except (TypeError, ValueError):
            raise InvalidRequest(f"'logit_bias' keys must be token ids, got {key!r}", param="logit_bias") from None
        pairs.append((tid, value))
    return tuple(sorted(pairs))


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class Metrics:
    """Per-request figures with the seed's names. Times are seconds."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    ttft: float | None = None
    tpot: float | None = None
    total_latency: float = 0.0
    tokens_per_second: float = 0.0
    output_tokens_per_second: float = 0.0
    queue_time: float = 0.0
    cached_tokens: int = 0  # prompt tokens whose KV was reused from a cached prefix, not computed
    speculative: dict[str, Any] | None = None  # guesses: proposed, accepted, steps, acceptance (+ lookup/draft)
    reasoning_tokens: int | None = None  # of output_tokens: inside the reasoning block (None: not tracked)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 6)
        return d


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class TokenEvent:
    """One step of one request: the new text (may be empty while bytes are held back)."""

    request_id: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    metrics: Metrics | None = None
    error: str | None = None
    error_code: str | None = None  # with finish_reason "error": "timeout", "engine_restart" or None
    stop_sequence: str | None = None  # with finish_reason "stop": the stop string that ended it, if one did
    # with SamplingParams.logprobs: (token id, logprob, [(id, logprob) of the top alternatives]) per token
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None


@dataclass
class GenerationOutput:
    request_id: str
    prompt: str
    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: Metrics


@dataclass
class EngineStats:
    running: int
    waiting: int
    tokens_per_second: float
    total_requests: int
    total_output_tokens: int
    cohorts: int = 0
    prompt_tokens_computed: int = 0   # prompt tokens prefilled (recomputed ones after preemption too)
    prompt_tokens_reused: int = 0     # prompt tokens copied from the prefix cache or a running row
    prefix_cache_bytes: int = 0       # KV bytes the prefix cache holds (inside kv_cache_mb)
    prefix_cache_entries: int = 0
    prefix_cache_evictions: int = 0   # cached prefixes dropped to make room
    speculative_proposed: int = 0     # prompt-lookup guesses verified (engine/speculation/speculate.py)
    speculative_accepted: int = 0     # guesses the model agreed with: tokens for free
    speculative_draft_proposed: int = 0  # of the guesses above, the draft model's (engine/speculation/draft.py)
    speculative_draft_accepted: int = 0
