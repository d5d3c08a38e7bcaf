"""Tool calls on the request side: ``tools`` and ``tool_choice`` checked field by field, and the
Hermes/Qwen syntax's helpers kept under their old names. Each model family's own syntax (grammar,
parser, prompt, history) lives in engine/formats/, which picks one per model; Hermes is the fallback::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Several calls follow each other, one per block, separated by a newline. The grammar fixes
every byte outside the arguments, and the arguments follow the tool's JSON schema, so the
parser below is a small state machine: it never has to guess or repair.

Two things end a list of calls cleanly on a small model (engine/closing.py does the engine's
side, docs/tools.md says why): a call that repeats an earlier one (same name and arguments)
ends the answer and is dropped, and a call whose arguments did not complete is never returned.
"""

from __future__ import annotations

import re
from typing import Any

from ortserve.engine.formats import (
    MAX_PARALLEL_CALLS,
    TOOL_MARK,
    Delta,
    Tool,
    ToolCall,
    ToolCallParser,
    ToolFormat,
    new_call_id,
)
from ortserve.engine.formats.hermes import HERMES
from ortserve.errors import InvalidRequest

__all__ = ["MAX_PARALLEL_CALLS", "TOOL_MARK", "Delta", "Tool", "ToolCall", "ToolCallParser", "new_call_id",
           "parse_choice", "parse_function", "parse_tools", "tool_grammar"]

OPEN, CLOSE = HERMES.open, HERMES.close
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MODES = ("none", "auto", "required")


def parse_tools(raw: list[Any] | None, param: str = "tools") -> list[Tool]:
    """OpenAI ``tools`` (function type) checked field by field; a 400 names the bad one."""
    tools: list[Tool] = []
    for i, t in enumerate(raw or []):
        where = f"{param}.{i}"
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise InvalidRequest(f"'{where}' must be {{\"type\": \"function\", \"function\": {{...}}}}", param=where)
        tools.append(parse_function(t["function"], f"{where}.function"))
    names = [t.name for t in tools]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise InvalidRequest(f"two tools are named '{dup}'", param=param)
    return tools


def parse_function(f: dict[str, Any], where: str) -> Tool:
    name = f.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidRequest(f"'{where}.name' must be 1-64 letters, digits, '_' or '-', got {name!r}",
                             param=f"{where}.name")
    params = f.get("parameters")
    if not isinstance(params, dict):
        raise InvalidRequest(f"'{where}.parameters' must be a JSON schema object (use "
                             "{\"type\": \"object\", \"properties\": {}} for a tool without arguments)",
                             param=f"{where}.parameters")
    if params.get("type", "object") != "object":
        raise InvalidRequest(f"'{where}.parameters' must describe an object (type 'object')",
                             param=f"{where}.parameters")
    desc = f.get("description") or ""
    if not isinstance(desc, str):
        raise InvalidRequest(f"'{where}.description' must be a string", param=f"{where}.description")
    return Tool(name, desc, params)


def parse_choice(choice: Any, tools: list[Tool], param: str = "tool_choice") -> str:
    """'none' | 'auto' | 'required' | a tool's name (the named choice)."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in MODES:
            raise InvalidRequest(f"'{param}' must be one of {', '.join(MODES)} or a named function, got {choice!r}",
                                 param=param)
        mode = choice
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict) and choice.get("type") == "function":
        mode = choice["function"].get("name")
        if mode not in {t.name for t in tools}:
            raise InvalidRequest(f"'{param}' names the function {mode!r}, which is not in 'tools'", param=param)
    else:
        raise InvalidRequest(f"'{param}' must be a string or {{\"type\": \"function\", \"function\": "
                             "{\"name\": ...}}", param=param)
    if mode != "none" and not tools:
        raise InvalidRequest(f"'{param}' is {choice!r} but no 'tools' are given", param=param)
    return mode


def tool_grammar(tools: list[Tool], mode: str, parallel: bool = True, fmt: ToolFormat = HERMES) -> str | None:
    """The Lark grammar for ``mode`` in ``fmt``'s syntax: auto = prose or calls; required = calls; named = that call."""
    return fmt.grammar(tools, mode, parallel)


def tools_prompt(tools: list[Tool]) -> str:
    return HERMES.tools_prompt(tools)


def call_text(name: str, arguments: str) -> str:
    return HERMES.call_text(name, arguments)


def fallback_messages(messages: list[dict[str, Any]], tools: list[Tool]) -> list[dict[str, Any]]:
    return HERMES.fallback_messages(messages, tools)


def hf_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return HERMES.hf_messages(messages)
