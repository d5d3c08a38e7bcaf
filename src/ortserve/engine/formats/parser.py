"""The streaming parser for every tool-call syntax (engine/formats/base.py's envelope): generated
text in, prose and OpenAI tool calls out, as it arrives.

The grammar fixes every byte outside the arguments and the arguments follow the tool's schema, so
this is a small state machine: it never has to guess or repair. Special-token markers a decoder
may drop (``[TOOL_CALLS]``, ``<|tool_call|>``) are read whether or not they are in the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ortserve.engine.detokenize import marker_start
from ortserve.engine.formats.base import Delta, ToolCall, ToolFormat
from ortserve.engine.formats.base import visible as _visible
from ortserve.engine.formats.hermes import HERMES


@dataclass
class ToolCallParser:
    """Splits generated text into prose and tool calls of one ``ToolFormat``.

    Arguments are passed on as soon as they are generated; only the fixed envelope around them
    is held back, and a call while it still reads like an earlier one (same name, arguments so far
    a prefix of that call's): if it completes as a repeat it is dropped (never streamed),
    ``repeated`` is set and the rest of the text is ignored. At ``finish`` a call whose arguments
    did not complete is dropped from ``calls``.
    """

    fmt: ToolFormat = HERMES
    lead: bool | None = None  # prose may come before the calls (the grammar says; default: ``fmt.lead_prose``)
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

    def __post_init__(self) -> None:
        f = self.fmt
        self._head = re.compile(re.escape(f.open) + r'\{"name": "([^"]*)", "' + re.escape(f.key) + '": ')
        # what may begin a list of calls: the prefix (or none when a decoder dropped a special token)
        self._starts = sorted({f.prefix, _visible(f.prefix), *f.accept}, key=len, reverse=True)
        if self.lead is None:
            self.lead = f.lead_prose
        self._opener = f.opener + "{"  # where calls begin after prose (``lead``)

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
    def in_prose(self) -> bool:
        """Whether the text so far ends in prose (or may still begin a call)."""
        return self._state in ("start", "text")

    @property
    def in_arguments(self) -> bool:
        """Whether the text so far ends inside a call's arguments."""
        return self._state == "args"

    @property
    def in_envelope(self) -> bool:
        """Whether the text so far ends after a call's arguments, before its closing text."""
        return self._state == "tail"

    def _step(self, out: list[Delta]) -> None:
        buf, f = self._buf, self.fmt
        if f.name_first and self._state in ("start", "tail"):
            self._named_head(buf, out)
        elif self._state == "start":
            lead = f.open + "{"
            for s in self._starts:
                if buf.startswith(s + lead):
                    self._buf, self._state = buf[len(s):], "head"
                    return
            if not any((s + lead).startswith(buf) for s in self._starts):
                self._state = "text"
        elif self._state == "text":
            self._text(buf, out)
        elif self._state == "head":
            m = self._head.match(buf)
            if m:
                self._start_call(m.group(1), out)
                self._buf = buf[m.end():]
                self._state, self._depth, self._in_str, self._esc = "args", 0, False, False
        elif self._state == "args":
            self._args(buf, out)
        elif self._state == "tail":
            self._tail(buf)

    def _text(self, buf: str, out: list[Delta]) -> None:
        """Prose: all of it, or (``lead``, before the first call) up to where the calls begin. Text
        that may be the start of the opening marker, and blank text before any prose, wait for more."""
        piece = buf
        if self.lead and not self.calls:
            at = buf.find(self._opener)
            if at >= 0:
                if self.content or buf[:at].strip():  # only blank text before the calls: no content
                    self.content += buf[:at]
                    out.append(Delta(content=buf[:at]))
                self._buf, self._state = buf[at + len(self.fmt.prefix):], "head"
                return
            piece = buf[:len(buf) - marker_start(buf, self._opener)]
            if not self.content and not piece.strip():
                return  # blank so far: prose or the calls may follow
        if piece:
            self.content += piece
            out.append(Delta(content=piece))
            self._buf = buf[len(piece):]

    def _named_head(self, buf: str, out: list[Delta]) -> None:
        """``name[ARGS]{`` (Mistral v11): a call starts, or the text is prose (first), or more is needed."""
        head = self.fmt.read_head(buf)
        if head is False:
            self._state = "text"  # prose; after a call, text that is not from our grammar, kept
        elif head is not True:
            n, name, call_id = head
            self._start_call(name, out, call_id)
            self._buf = buf[n:]
            self._state, self._depth, self._in_str, self._esc = "args", 0, False, False

    def _start_call(self, name: str, out: list[Delta], call_id: str = "") -> None:
        # the model's own id ([CALL_ID]) where it wrote one that this answer has not used yet
        fresh = call_id and all(c.id != call_id for c in self.calls)
        call = ToolCall(call_id if fresh else self.fmt.new_call_id(), name)
        self.calls.append(call)
        first = Delta(index=len(self.calls) - 1, call=call)
        if any(c.name == call.name for c in self.calls[:-1]):
            self._held = [first]
        else:
            out.append(first)

    def _tail(self, buf: str) -> None:
        f = self.fmt
        end = "}" + f.close
        nxt = end + f.sep + f.open + "{"
        if buf.startswith(nxt):
            self._buf, self._state = buf[len(end) + len(f.sep):], "head"
            return
        if nxt.startswith(buf):
            return  # could still be the next call
        for suffix in sorted({f.suffix, _visible(f.suffix)}, key=len, reverse=True):
            if buf.startswith(end + suffix) and (suffix or len(buf) > len(end)):
                self._buf, self._state = buf[len(end) + len(suffix):], "text"  # not from our grammar; kept
                return
            if suffix and (end + suffix).startswith(buf):
                return  # the longer closing marker may still come

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

