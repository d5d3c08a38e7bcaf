"""What the router hands back: its decision (who answers, in what order, why), the first
event of a stream (who is answering) and the finished answer with its route and cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortserve.router.rules import Facts
from ortserve.types import Usage


@dataclass(frozen=True)
class Target:
    provider: str
    model: str


@dataclass
class Decision:
    """Who answers and why; `chain` is the order they are tried in (first = provider)."""

    provider: str
    model: str
    reason: str
    chain: list[Target]
    private: bool
    facts: Facts
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "model": self.model, "reason": self.reason,
                "chain": [f"{t.provider}:{t.model}" for t in self.chain], "private": self.private,
                "complexity": self.facts.complexity, "complexity_estimated": self.facts.complexity_estimated,
                "prompt_tokens": self.facts.prompt_tokens, "notes": self.notes}


@dataclass
class RouteStart:
    """First event of Router.stream: who is answering (send these headers now)."""

    provider: str
    model: str
    reason: str

    def headers(self) -> dict[str, str]:
        return {"X-Ortserve-Provider": self.provider, "X-Ortserve-Model": _header(self.model),
                "X-Ortserve-Route-Reason": _header(self.reason)}


@dataclass
class ChatResult:
    text: str
    usage: Usage
    finish_reason: str
    provider: str
    model: str
    reason: str
    cost_usd: float | None
    local: bool
    failed: list[str] = field(default_factory=list)  # providers tried before this one, and why
    tool_calls: list[dict[str, Any]] | None = None   # OpenAI message.tool_calls
    logprobs: list[dict[str, Any]] | None = None     # OpenAI logprobs.content, when asked for

    def headers(self) -> dict[str, str]:
        h = RouteStart(self.provider, self.model, self.reason).headers()
        if self.cost_usd is not None:
            h["X-Ortserve-Cost-Usd"] = f"{self.cost_usd:.8f}"
        return h

    def metadata(self) -> dict[str, Any]:
        """For the response body, e.g. {"ortserve": result.metadata()}."""
        return {"provider": self.provider, "model": self.model, "reason": self.reason,
                "cost_usd": self.cost_usd, "local": self.local, "failed": self.failed}


def _header(value: str) -> str:
    """A value safe for an HTTP header: ASCII, one line, at most 300 characters."""
    return value.encode("ascii", "replace").decode("ascii").replace("\n", " ")[:300]
