r"""What every tool-call syntax shares: tools, calls, streamed deltas, and ``ToolFormat``, one
syntax described by its envelope.

Every family's syntax is a list of JSON calls in an envelope::

    prefix  open {"name": "f", "<key>": {...}} close  sep  open {...} close  suffix

(Hermes: ``<tool_call>\\n`` … ``\\n</tool_call>`` per call; Llama 3: bare objects with
``"parameters"``; Mistral: ``[TOOL_CALLS][`` … ``, `` … ``]``; Phi-4-mini: ``<|tool_call|>[`` …
``]<|/tool_call|>``; Gemma: a fenced ``tool_code`` block per call; Mistral v11 replaces the JSON
object's head and tail with ``[TOOL_CALLS]name[ARGS]`` and nothing, ``head_text``/``tail_text``,
``read_head``.) From that one description come
the Lark grammar that forces it, the text of a call (for history a template cannot render), the
prompt that describes the tools, and the streaming parser (engine/formats/parser.py).
"""

from __future__ import annotations

import json
import random
import re
import string
import uuid
from dataclasses import dataclass, replace
from typing import Any

from ortserve.engine.jsonlark import schema_lark

# The first line of every tool grammar (a Lark comment), followed by the format's name: the engine
# knows the grammar is a list of calls, in which syntax, and watches it (engine/closing.py).
TOOL_MARK = "// ortserve: tool calls"
# after the format's name on that line: prose may come before the calls (``ToolFormat.lead_prose``)
LEAD = "lead"
# after the format's name: the answer must be a call (required or a named tool): its first call is
# closed within max_tokens (engine/closing.py, ToolBudget)
MUST = "must"
# A small model rarely ends a list of calls by itself; a repeat ends it (engine/closing.py), and
# the cap bounds a list of different calls that never ends.
MAX_PARALLEL_CALLS = 4


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


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


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


SPECIAL_MARKERS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|tool_call|>", "<|/tool_call|>")
# markers that are one token in some vocabularies without being special: Qwen's <tool_call> is an
# added token that decoders keep, so the text still shows it (``ToolFormat.bind``)
TOKEN_MARKERS = (*SPECIAL_MARKERS, "<tool_call>", "</tool_call>")


def visible(marker: str) -> str:
    """A marker without its special tokens (``[TOOL_CALLS][`` -> ``[``), as a decoder that skips them shows it."""
    return re.sub("|".join(map(re.escape, SPECIAL_MARKERS)), "", marker)


def _regex_literal(text: str) -> str:
    """``text`` as a regex inside a Lark ``/.../`` (llguidance's syntax)."""
    return "".join("\\n" if c == "\n" else "\\" + c if c in "\\.+*?()|[]{}^$#&-~/" else c for c in text)


def _char_class(chars: str) -> str:
    return "".join("\\" + c if c in "\\]^-[/" else c for c in sorted(set(chars)))


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call syntax. ``detect`` strings: any of them in a chat template picks the format."""

    name: str
    open: str = ""                 # before each call
    close: str = ""                # after each call's object
    sep: str = "\n"                # between calls
    prefix: str = ""               # once, before the first call
    suffix: str = ""               # once, after the last call
    key: str = "arguments"         # the arguments' key in a call object
    accept: tuple[str, ...] = ()   # prefixes the parser also accepts (Llama's <|python_tag|>)
    detect: tuple[str, ...] = ()
    result_open: str = "<tool_response>\n"
    result_close: str = "\n</tool_response>"
    system_role: bool = True       # False: the template refuses a system turn (Gemma)
    alternate: bool = False        # the template wants user/assistant turns strictly alternating
    id_chars: int = 0              # >0: call ids are this many letters and digits (Mistral's templates)
    # markers that are one special token in this model's vocabulary, with its id (``bind``): the grammar
    # asks for the token the model was trained to write, not the marker spelled out in ordinary tokens
    specials: tuple[tuple[str, int], ...] = ()
    name_first: bool = False       # calls are ``name`` + arguments, not a JSON object with a name (``read_head``)
    dropped: tuple[str, ...] = ()  # of ``specials``: the markers a decoder skips (special tokens)

    def bind(self, vocab: dict[str, int], dropped: set[str] | None = None) -> ToolFormat:
        """This format for a model whose added tokens are ``vocab`` (text -> id), ``dropped`` of them
        special (a decoder skips them; None: all of them)."""
        envelope = self.prefix + self.suffix + self.head_text("f") + self.tail_text()
        found = tuple((m, vocab[m]) for m in TOKEN_MARKERS if m in vocab and m in envelope)
        return replace(self, specials=found,
                       dropped=tuple(m for m, _ in found if dropped is None or m in dropped))

    # -- the grammar -----------------------------------------------------------------------------
    def grammar(self, tools: list[Tool], mode: str, parallel: bool = True,
                think: tuple[str, bool] | None = None) -> str | None:
        """The Lark grammar for ``mode``: auto = prose or calls (prose then calls where ``lead_prose``);
        required = calls; named = that call. ``think``: under auto, the Lark of a thinking model's
        reasoning block (``THOUGHT`` between its marker tokens), which may come first, and whether it
        must (the prompt opened it: ``TextCodec.think_lark``)."""
        if mode == "none":
            return None
        chosen = tools if mode in ("auto", "required") else [t for t in tools if t.name == mode]
        many = parallel and mode in ("auto", "required")
        lead = mode == "auto" and self.lead_prose
        one = " ".join(x for x in (self._lit(self.sep), "call") if x)
        more = f" ({one}){{0,{MAX_PARALLEL_CALLS - 1}}}" if many else ""
        calls = " ".join(x for x in (self._lit(self.prefix), "call" + more, self._lit(self.suffix)) if x)
        lines = [f"calls: {calls}", "call: " + " | ".join(f"call_{i}" for i in range(len(chosen)))]
        # the opening marker spelled out: prose and the marker are one lexeme, which ends where the
        # marker does; a marker that is one token ends any prose lexeme by itself
        spelled = lead and not any(m in self.opener for m, _ in self.specials)
        if spelled:
            lines += [f"lead: LEAD first{more} {self._lit(self.suffix)}".rstrip(),
                      "first: " + " | ".join(f"first_{i}" for i in range(len(chosen)))]
        for i, t in enumerate(chosen):
            head, tail = self.head_text(t.name), self._lit(self.tail_text())
            lines.append(f"call_{i}: " + " ".join(x for x in (self._lit(head), f"args_{i}", tail) if x))
            if spelled:
                lines.append(f"first_{i}: " + " ".join(x for x in (self._lit(head[len(self.open):]), f"args_{i}", tail)
                                                       if x))
            # only the declared properties unless the schema says otherwise: a small model pads calls
            # with invented keys when JSON's default (extra keys allowed) is left open
            args = {"type": "object", "additionalProperties": False, **t.parameters}
            lines.append(f"args_{i}: {schema_lark(args)}")
        if lead:  # the marker spelled out never appears in prose: it always begins calls
            opener = _regex_literal(self.opener)  # as the text shows it: no marker of a lead format is dropped
            lines.append(f"TEXT: /[\\s\\S]+/ & ~/[\\s\\S]*{opener}[\\s\\S]*/")
            if spelled:
                lines.append(f"LEAD: /[\\s\\S]*{opener}/ & ~/[\\s\\S]*{opener}[\\s\\S]+/")
        else:
            lines.append(f"TEXT: /{self.prose()}/")
        body = ("TEXT | lead" if spelled else "TEXT | TEXT? calls") if lead else "TEXT | calls"
        if think is not None and mode == "auto":  # a thinking model may reason first (engine/reasoning.py)
            block, first = think
            lines += [f"think: {block}", "THOUGHT: /[\\s\\S]*/"]
            body = f"think ({body})" if first else f"think? ({body})"
        start = f"start: {body}" if mode == "auto" else "start: calls"
        mark = f"{TOOL_MARK} {self.name}" + (f" {LEAD}" if lead else "") + (f" {MUST}" if mode != "auto" else "")
        return "\n".join([mark, start, *lines, ""])

    @property
    def opener(self) -> str:
        r"""The text that begins a list of calls (``<tool_call>\n``, ``[TOOL_CALLS][``; Llama 3: none)."""
        return self.prefix + self.open

    @property
    def lead_prose(self) -> bool:
        """Whether prose may come before the calls under ``auto`` ("Let me check." then a call, or
        a Qwen3 model's thinking): where the calls begin with a marker the parser sees in the text
        (Hermes' ``<tool_call>``, also where it is one token, as in Qwen's vocabulary; Gemma's fence;
        a marker spelled out in ordinary tokens). Not where the marker is a special token that the
        decoder drops (Mistral's tekken, Phi-4-mini), nor before Llama 3's bare ``{`` or Mistral
        v11's bare name: the text would not show where the prose ends and the call begins."""
        return len(self.opener) > 1 and not self.dropped and not self.name_first

    def prose(self) -> str:
        """The regex of prose under ``auto`` where it cannot come before a call (``lead_prose``
        false): it must not begin like a call (nor like an accepted prefix)."""
        lead = self.open + "{"
        first = _char_class("".join((s + lead)[0] for s in (self.prefix, visible(self.prefix), *self.accept)))
        return f"[^{first}][\\s\\S]*"

    # -- text of calls and of the tools ------------------------------------------------------------
    def read_head(self, buf: str) -> tuple[int, str, str] | bool:
        """For a syntax whose calls start with the bare name (``name_first``, Mistral v11): the head
        of a call at the start of ``buf`` as (its length, the name, a call id or ""), True while
        ``buf`` may still become one, False when it cannot. The JSON envelopes never call it."""
        return False

    def head_text(self, name: str) -> str:
        """A call's text before its arguments object."""
        return self.open + '{"name": ' + json.dumps(name) + f', "{self.key}": '

    def tail_text(self) -> str:
        """A call's text after its arguments object."""
        return "}" + self.close

    def call_text(self, name: str, arguments: str) -> str:
        return self.head_text(name) + (arguments or "{}") + self.tail_text()

    def calls_text(self, calls: list[tuple[str, str]]) -> str:
        return self.prefix + self.sep.join(self.call_text(n, a) for n, a in calls) + self.suffix

    def tools_prompt(self, tools: list[Tool]) -> str:
        """Describes the tools for a chat template that has no ``tools`` support of its own."""
        specs = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                          for t in tools)
        example = self.calls_text([("<function name>", "<arguments as a JSON object>")])
        more = f" (several calls: separated by {json.dumps(self.sep)})" if self.sep else ""
        return ("You can call functions. Their JSON schemas are inside <tools></tools>:\n<tools>\n" + specs +
                f"\n</tools>\nTo call a function, answer with{more}:\n" + example +
                "\nFunction results come back as:\n" + self.result_open + "<result>" + self.result_close)

    def new_call_id(self) -> str:
        if self.id_chars:
            return "".join(random.choices(string.ascii_letters + string.digits, k=self.id_chars))
        return new_call_id()

    # -- messages for a template ---------------------------------------------------------------------
    def fallback_messages(self, messages: list[dict[str, Any]], tools: list[Tool]) -> list[dict[str, Any]]:
        """Messages for a template without tool support: tools in the system prompt, calls and
        results as text in this syntax (the model reads back what it wrote)."""
        out: list[dict[str, Any]] = []
        for m in messages:
            role, content = m["role"], m.get("content") or ""
            if role == "assistant" and m.get("tool_calls"):
                calls = self.calls_text([(c["function"]["name"], c["function"].get("arguments") or "{}")
                                         for c in m["tool_calls"]])
                out.append({"role": "assistant", "content": (content + "\n" if content else "") + calls})
            elif role == "tool":
                out.append({"role": "user", "content": self.result_open + content + self.result_close})
            else:
                out.append({"role": role, "content": content})
        if tools:
            prompt = self.tools_prompt(tools)
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
            else:
                out.insert(0, {"role": "system", "content": prompt})
        return self._shaped(out)

    def _shaped(self, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.system_role and out and out[0]["role"] == "system":
            system = out.pop(0)["content"]
            if out and out[0]["role"] == "user":
                out[0] = {"role": "user", "content": system + "\n\n" + out[0]["content"]}
            else:
                out.insert(0, {"role": "user", "content": system})
        if self.alternate:  # consecutive turns of one role (tool results after a user turn) become one
            merged: list[dict[str, Any]] = []
            for m in out:
                if merged and merged[-1]["role"] == m["role"]:
                    merged[-1] = {"role": m["role"], "content": merged[-1]["content"] + "\n\n" + m["content"]}
                else:
                    merged.append(m)
            out = merged
        return out

    def hf_messages(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None) -> list[dict[str, Any]]:
        """Messages for a template with tool support, as Hugging Face templates expect them:
        ``tool_calls[i].function.arguments`` as a dict (templates write it with ``tojson``). The
        tools themselves go to the template's ``tools`` variable (a format whose template reads
        them elsewhere puts them there)."""
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


    def _lit(self, s: str) -> str:
        """``s`` as Lark: quoted text, a bound special marker as its token (``<[id]>``)."""
        for marker, token in self.specials:
            if marker in s:
                head, _, tail = s.partition(marker)
                return " ".join(x for x in (self._lit(head), f"<[{token}]>", self._lit(tail)) if x)
        return json.dumps(s) if s else ""
