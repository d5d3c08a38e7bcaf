"""Phi-4-mini: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>`` (tools are
described inside ``<|tool|>...<|/tool|>`` in the system turn by its template)."""

from __future__ import annotations

from ortserve.engine.formats.base import ToolFormat

PHI4 = ToolFormat("phi4", prefix="<|tool_call|>[", sep=", ", suffix="]<|/tool_call|>",
                  detect=("<|tool_call|>", "<|tool|>"), result_open="<|tool_response|>", result_close="<|/tool_response|>")
