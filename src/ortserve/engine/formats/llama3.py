"""Llama 3.1 / 3.2 / 3.3: a bare JSON object ``{"name": ..., "parameters": {...}}`` (the templates'
own instruction), ``<|python_tag|>`` before it accepted when parsing. Several calls are separated
by ``; `` (as vLLM's llama3_json parser reads them); the 3.1 template renders one call per
assistant turn, so a turn with several calls is split into consecutive turns for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortserve.engine.formats.base import Tool, ToolFormat


@dataclass(frozen=True)
class Llama3Format(ToolFormat):
    def hf_messages(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in super().hf_messages(messages, tools):
            calls = m.get("tool_calls") or []
            if len(calls) > 1:  # "This model only supports single tool-calls at once!"
                out += [{**m, "content": m.get("content") if i == 0 else "", "tool_calls": [c]}
                        for i, c in enumerate(calls)]
            else:
                out.append(m)
        return out


LLAMA3 = Llama3Format("llama3_json", sep="; ", key="parameters", accept=("<|python_tag|>",),
                      detect=('"parameters": dictionary of argument name', "<|python_tag|>"),
                      result_open="<|python_tag|>output: ", result_close="")
