"""Routing rules (condition -> action, first match wins) and the complexity estimate."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ortserve.providers.base import Hints

Level = Literal["low", "medium", "high"]


def _listify(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


class Condition(BaseModel):
    """Every field given must match (AND); a field not given matches anything."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    privacy: list[Level] | None = None
    local_only: bool | None = Field(None, alias="localOnly")
    complexity: list[Level] | None = None
    agent_type: list[str] | None = Field(None, alias="agentType")
    max_prompt_tokens: int | None = Field(None, ge=0, alias="maxPromptTokens")
    min_prompt_tokens: int | None = Field(None, ge=0, alias="minPromptTokens")

    _lists = field_validator("privacy", "complexity", "agent_type", mode="before")(_listify)


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")

    provider: str
    model: str | None = None


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    condition: Condition = Condition.model_validate({})  # pydantic copies defaults
    action: Action
    reason: str | None = None


@dataclass(frozen=True)
class Facts:
    """What rules look at: the hints plus what the router measured."""

    privacy: str | None
    local_only: bool
    complexity: str
    complexity_estimated: bool
    agent_type: str | None
    prompt_tokens: int


def matches(cond: Condition, facts: Facts) -> bool:
    if cond.privacy is not None and facts.privacy not in cond.privacy:
        return False
    if cond.local_only is not None and facts.local_only != cond.local_only:
        return False
    if cond.complexity is not None and facts.complexity not in cond.complexity:
        return False
    if cond.agent_type is not None and facts.agent_type not in cond.agent_type:
        return False
    if cond.max_prompt_tokens is not None and facts.prompt_tokens > cond.max_prompt_tokens:
        return False
    return cond.min_prompt_tokens is None or facts.prompt_tokens >= cond.min_prompt_tokens


def first_match(rules: list[Rule], facts: Facts) -> tuple[int, Rule] | None:
    for i, rule in enumerate(rules):
        if matches(rule.condition, facts):
            return i, rule
    return None


def describe(rule: Rule, index: int) -> str:
    """The rule's reason, or a readable summary of its condition."""
    if rule.reason:
        return rule.reason
    c = rule.condition.model_dump(by_alias=True, exclude_none=True)
    said = ", ".join(f"{k}={v}" for k, v in c.items()) or "always"
    return f"rule {index + 1} matched ({said})"


# -- complexity ------------------------------------------------------------------------------
# A deliberately simple, documented estimate (docs/router.md): hard-task words and code
# push it up, short plain questions pull it down. Callers who know better send a hint.
HARD_WORDS = re.compile(
    r"\b(prove|proof|derive|architect\w*|design|refactor\w*|optimi[sz]e\w*|debug\w*|analy[sz]e\w*|"
    r"step[- ]by[- ]step|trade-?offs?|compare|algorithm\w*|concurren\w*|distributed|"
    r"security|theorem|complexity|implement\w*|migrat\w*)\b", re.IGNORECASE)
CODE = re.compile(r"```|\bdef |\bclass |\bfunction\b|#include|=>|\breturn\b")
LOW_TOKENS = 200
HIGH_TOKENS = 2000


def estimate_complexity(text: str, prompt_tokens: int) -> Level:
    """high: > 2000 prompt tokens, or >= 3 hard-task words, or code plus a hard-task word.
    low: < 200 prompt tokens, no code and no hard-task word. Otherwise medium."""
    hard = len(HARD_WORDS.findall(text))
    code = bool(CODE.search(text))
    if prompt_tokens > HIGH_TOKENS or hard >= 3 or (code and hard >= 1):
        return "high"
    if prompt_tokens < LOW_TOKENS and not code and hard == 0:
        return "low"
    return "medium"


def facts_for(hints: Hints, text: str, prompt_tokens: int) -> Facts:
    complexity = hints.complexity or estimate_complexity(text, prompt_tokens)
    return Facts(privacy=hints.privacy, local_only=hints.local_only, complexity=complexity,
                 complexity_estimated=hints.complexity is None, agent_type=hints.agent_type,
                 prompt_tokens=prompt_tokens)
