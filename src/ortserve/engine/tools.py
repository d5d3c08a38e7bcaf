"""Tool calls as text: the format the model writes, the grammar that forces it, the prompt
that describes the tools to a template without tool support, and a streaming parser.

The format is the Hermes/Qwen one, which many chat models already know::

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

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ortserve.engine.guidance import schema_lark
from ortserve.errors import InvalidRequest

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"
# The first line of every tool grammar (a Lark comment): the engine knows the grammar is a list of
# calls and watches it for repeats and for calls it has no tokens left to finish (engine/closing.py).
TOOL_MARK = "// ortserve: tool calls"
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MODES = ("none", "auto", "required")
# A small model rarely ends a list of calls by itself (after a call, "\n<tool_call>" beats the end
# token). What it writes next is mostly the same call again, and a repeat ends the answer
# (engine/closing.py); a new call starts only if the tokens left can hold one. The cap bounds
# what is left: a list of different calls that never ends.
MAX_PARALLEL_CALLS = 4


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


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


def tool_grammar(tools: list[Tool], mode: str, parallel: bool = True) -> str | None:
    """The Lark grammar for ``mode``: auto = prose or calls; required = calls; named = that call."""
    if mode == "none":
        return None
    chosen = tools if mode in ("auto", "required") else [t for t in tools if t.name == mode]
    more = f'("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}'
    lines = [f"calls: call {more}" if parallel and mode in ("auto", "required") else "calls: call",
             "call: " + " | ".join(f"call_{i}" for i in range(len(chosen)))]
    for i, t in enumerate(chosen):
        head = OPEN + '{"name": ' + json.dumps(t.name) + ', "arguments": '
        lines.append(f"call_{i}: {json.dumps(head)} args_{i} {json.dumps('}' + CLOSE)}")
        # only the declared properties unless the schema says otherwise: a small model pads calls
        # with invented keys when JSON's default (extra keys allowed) is left open
        args = {'type': 'object', 'additionalProperties': False, **t.parameters}
        lines.append(f"args_{i}: {schema_lark(args)}")
    start = "start: TEXT | calls" if mode == "auto" else "start: calls"
    # prose under auto must not begin like a call; that is the only thing it cannot be
    return "\n".join([TOOL_MARK, start, *lines, r"TEXT: /[^<][\s\S]*/", ""])


def tools_prompt(tools: list[Tool]) -> str:
    """Describes the tools for a chat template that has no ``tools`` support of its own."""
    specs = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                      for t in tools)
    return ("You can call functions. Their JSON schemas are inside <tools></tools>:\n<tools>\n" + specs +
            "\n</tools>\nTo call a function, answer with one block per call:\n" + OPEN +
            '{"name": <function name>, "arguments": <arguments as a JSON object>}' + CLOSE +
            "\nFunction results come back inside <tool_response></tool_response>.")


def call_text(name: str, arguments: str) -> str:
    return OPEN + '{"name": ' + json.dumps(name) + ', "arguments": ' + (arguments or "{}") + "}" + CLOSE


def fallback_messages(messages: list[dict[str, Any]], tools: list[Tool]) -> list[dict[str, Any]]:
    """Messages for a template without tool support: tools in the system prompt, calls and
    results as text in the format above (the model reads back what it wrote)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(call_text(c["function"]["name"], c["function"].get("arguments") or "{}")
                              for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (content + "\n" if content else "") + calls})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if tools:
        prompt = tools_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def hf_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template with tool support, as Hugging Face templates expect them:
    ``tool_calls[i].function.arguments`` as a dict (templates write it with ``tojson``)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c["function"])
                try:
                    fn["arguments"] = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    pass
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Delta:
    """One piece of streamed output: prose, the start of a call, or more of its arguments."""

    content: str = ""
    index: int = -1            # the call this delta belongs to (-1: prose)
    call: ToolCall | None = None  # set on the first delta of a call
    arguments: str = ""


@dataclass
class ToolCallParser:
    """Splits generated text into prose and tool calls as it arrives.

    Arguments are passed on as soon as they are generated (no buffering to the end of a
    call); only the fixed envelope around them is held back, and a call while it still reads
    like an earlier one (same name, arguments so far a prefix of that call's): if it completes
    as a repeat it is dropped (never streamed), ``repeated`` is set and the rest of the text is
    ignored. At ``finish`` a call whose arguments did not complete is dropped from ``calls``
    (in a stream its first pieces are already out; the engine starts no call it cannot finish).
    """

    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    repeated: bool = False    # a call repeated an earlier one: it was dropped and the answer ends there
    dropped: list[ToolCall] = field(default_factory=list)  # repeats and calls cut before their arguments closed
    _buf: str = ""
    _state: str = "start"   # start | text | head | args | tail | end
    _depth: int = 0
    _in_str: bool = False
    _esc: bool = False
    _held: list[Delta] | None = None  # the current call's deltas while it reads like an earlier call

    def feed(self, text: str) -> list[Delta]:
        if self._state == "end":
            return []
        self._buf += text
        out: list[Delta] = []
        while self._buf and self._state != "end":
            before = (self._state, len(self._buf))
            self._step(out)
            if (self._state, len(self._buf)) == before:
                break  # need more text
        return out

    def finish(self) -> list[Delta]:
        """The end of generation: whatever is held back is prose; an unfinished call is dropped."""
        out: list[Delta] = []
        if self._buf and self._state in ("start", "text"):
            self.content += self._buf
            out.append(Delta(content=self._buf))
        if self._state == "args":
            self.dropped.append(self.calls.pop())
        self._buf, self._held = "", None
        return out

    @property
    def in_arguments(self) -> bool:
        """Whether the text so far ends inside a call's arguments."""
        return self._state == "args"

    @property
    def in_envelope(self) -> bool:
        """Whether the text so far ends after a call's arguments, before its closing tag."""
        return self._state == "tail"

    def _step(self, out: list[Delta]) -> None:
        buf = self._buf
        if self._state == "start":
            if buf.startswith(OPEN):
                self._state = "head"
            elif not OPEN.startswith(buf):
                self._state = "text"
        elif self._state == "text":
            self.content += buf
            out.append(Delta(content=buf))
            self._buf = ""
        elif self._state == "head":
            m = re.match(re.escape(OPEN) + r'\{"name": "([^"]*)", "arguments": ', buf)
            if m:
                call = ToolCall(new_call_id(), m.group(1))
                self.calls.append(call)
                first = Delta(index=len(self.calls) - 1, call=call)
                if any(c.name == call.name for c in self.calls[:-1]):
                    self._held = [first]
                else:
                    out.append(first)
                self._buf = buf[m.end():]
                self._state, self._depth, self._in_str, self._esc = "args", 0, False, False
        elif self._state == "args":
            self._args(buf, out)
        elif self._state == "tail":
            end = "}" + CLOSE
            if buf.startswith(end + "\n"):
                self._buf, self._state = buf[len(end) + 1:], "head"
            elif buf.startswith(end) and len(buf) > len(end):
                self._buf, self._state = buf[len(end):], "text"  # not from our grammar; keep it visible

    def _args(self, buf: str, out: list[Delta]) -> None:
        n = self._scan(buf)
        piece, call = buf[:n], self.calls[-1]
        call.arguments += piece
        self._buf = buf[n:]
        delta = Delta(index=len(self.calls) - 1, arguments=piece)
        if self._held is None:
            out.append(delta)
        else:
            self._held.append(delta)
            if not any(c.name == call.name and c.arguments.startswith(call.arguments) for c in self.calls[:-1]):
                out.extend(self._held)  # it differs from every earlier call: pass it on
                self._held = None
        if self._depth == 0 and call.arguments:
            if self._held is not None:  # complete and equal to an earlier call (a JSON object ends at its brace)
                self.dropped.append(self.calls.pop())
                self.repeated, self._held, self._buf, self._state = True, None, "", "end"
            else:
                self._state = "tail"

    def _scan(self, buf: str) -> int:
        """How much of ``buf`` belongs to the arguments object (string-aware brace depth)."""
        for i, ch in enumerate(buf):
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return len(buf)
