"""Tool-call syntaxes, one module per family, and the registry that picks a model's (docs/tools.md)."""

from ortserve.engine.formats.base import (
           LEAD,
           MAX_PARALLEL_CALLS,
           MUST,
           TOOL_MARK,
           Delta,
           Tool,
           ToolCall,
           ToolFormat,
           new_call_id,
)
from ortserve.engine.formats.parser import ToolCallParser
from ortserve.engine.formats.registry import FALLBACK, FORMATS, by_name, choose, detect

__all__ = ["FALLBACK", "FORMATS", "LEAD", "MAX_PARALLEL_CALLS", "MUST", "TOOL_MARK", "Delta", "Tool", "ToolCall", "ToolCallParser",
           "ToolFormat", "by_name", "choose", "detect", "new_call_id"]
