r"""Hermes / Qwen 2.5 / Qwen 3: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``,
one block per call, separated by a newline. Also the fallback for a template with no tool syntax
of its own (Phi-3.5, SmolLM2...): many chat models know it."""

from __future__ import annotations

from ortserve.engine.formats.base import ToolFormat

HERMES = ToolFormat("hermes", open="<tool_call>\n", close="\n</tool_call>", sep="\n", detect=("<tool_call>",))
