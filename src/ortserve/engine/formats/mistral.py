"""Mistral Nemo / Small: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``. The templates
require call ids of 9 letters and digits: the parser hands out such ids, and ids a client sends
back in another shape are mapped to 9 characters (the same id always to the same 9)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from ortserve.engine.formats.base import Tool, ToolFormat

ID = re.compile(r"^[A-Za-z0-9]{9}$")


def short_id(call_id: Any) -> str:
    text = str(call_id or "")
    return text if ID.match(text) else hashlib.sha256(text.encode()).hexdigest()[:9]


@dataclass(frozen=True)
class MistralFormat(ToolFormat):
    def hf_messages(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None) -> list[dict[str, Any]]:
        return _system_kept(with_short_ids(super().hf_messages(messages, tools)))


def with_short_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every call id, in the calls and in their results, as the 9 characters the templates require."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "id": short_id(c.get("id"))} for c in m["tool_calls"]]}
        if m["role"] == "tool":
            m = {**m, "tool_call_id": short_id(m.get("tool_call_id"))}
        out.append(m)
    return out


def _system_kept(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The templates write the system prompt only before the LAST user turn, so in a tool loop
    (the last turn is a tool result) it would vanish: put it into the last user turn here, as
    mistral-common does, instead."""
    if not messages or messages[0]["role"] != "system" or messages[-1]["role"] == "user":
        return messages
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    if last < 0:
        return messages
    out = messages[1:]
    out[last - 1] = {**out[last - 1], "content": messages[0]["content"] + "\n\n" + out[last - 1]["content"]}
    return out


MISTRAL = MistralFormat("mistral", prefix="[TOOL_CALLS][", sep=", ", suffix="]", detect=("[TOOL_CALLS]",),
                        result_open="[TOOL_RESULTS]", result_close="[/TOOL_RESULTS]", id_chars=9, alternate=True)
