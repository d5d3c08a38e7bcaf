"""Engine-neutral data types shared by the engine, providers, router, server and CLI."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
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

    def __post_init__(self) -> None:
        if self.json_schema is not None and not isinstance(self.json_schema, str):
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
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
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not (-2**63 <= self.seed < 2**64)):
            raise bad("seed", f"must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if len(self.stop) > 4 or any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "must be up to 4 non-empty strings")
        if not _finite(self.repetition_penalty) or not (0 < self.repetition_penalty <= 10):
            raise bad("repetition_penalty", f"must be in (0, 10], got {self.repetition_penalty!r}")
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


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
