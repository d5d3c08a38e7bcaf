"""Seeded ``tool_choice: "required"`` / named requests against a served model, counting the answers
that carry a call whose arguments parse: shared by the suite (a few seeds per family) and
benchmarks/tool_required.py (100 seeds per family, the issue 46 target)."""

from __future__ import annotations

import json
from typing import Any

import httpx

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web.",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                     "required": ["query"]}}}]
NAMED = {"type": "function", "function": {"name": "search"}}


def ask(url: str, model: str, seed: int, choice: Any, max_tokens: int = 64) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": TOOLS, "tool_choice": choice, "max_tokens": max_tokens, "seed": seed, "temperature": 1.0},
        timeout=120)


def parsed_call(r: httpx.Response, name: str | None = None) -> str | None:
    """Why this answer is not a parseable call (None when it is one)."""
    if r.status_code != 200:
        return f"status {r.status_code}: {r.text[:200]}"
    choice = r.json()["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    if not calls:
        return f"no call ({choice['finish_reason']}): {choice['message'].get('content')!r:.200}"
    for c in calls:
        try:
            args = json.loads(c["function"]["arguments"])
        except ValueError:
            return f"arguments do not parse: {c['function']['arguments']!r:.200}"
        if not isinstance(args, dict) or (name and c["function"]["name"] != name):
            return f"not a call of {name or 'a tool'}: {c!r:.200}"
    return None


def count(url: str, model: str, seeds: range, choice: Any = "required") -> tuple[int, list[str]]:
    """(answers with a parseable call, the reasons of the others)."""
    name = choice["function"]["name"] if isinstance(choice, dict) else None
    bad = [f"seed {s}: {why}" for s in seeds if (why := parsed_call(ask(url, model, s, choice), name))]
    return len(seeds) - len(bad), bad
