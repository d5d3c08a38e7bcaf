"""Phi-4-mini: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>``.

Its template reads the tools from the system message's ``tools`` field (a JSON string written
inside ``<|tool|>...<|/tool|>``), not from the ``tools`` variable, and renders only each turn's
content: the tools go into the system message (one is added if there is none), earlier calls are
written back in the syntax above, and results as ``<|tool_response|>...<|/tool_response|>`` user turns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ortserve.engine.formats.base import Tool, ToolFormat


@dataclass(frozen=True)
class Phi4Format(ToolFormat):
    def hf_messages(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in messages:
            content = m.get("content") or ""
            if m["role"] == "assistant" and m.get("tool_calls"):
                calls = self.calls_text([(c["function"]["name"], c["function"].get("arguments") or "{}")
                                         for c in m["tool_calls"]])
                out.append({"role": "assistant", "content": (content + "\n" if content else "") + calls})
            elif m["role"] == "tool":
                out.append({"role": "user", "content": self.result_open + content + self.result_close})
            else:
                out.append({"role": m["role"], "content": content})
        if tools:
            specs = json.dumps([{"name": t.name, "description": t.description, "parameters": t.parameters}
                                for t in tools])
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "tools": specs}
            else:
                out.insert(0, {"role": "system", "content": "", "tools": specs})
        return out


PHI4 = Phi4Format("phi4", prefix="<|tool_call|>[", sep=", ", suffix="]<|/tool_call|>",
                  detect=("<|tool_call|>", "<|tool|>"), result_open="<|tool_response|>",
                  result_close="<|/tool_response|>")
