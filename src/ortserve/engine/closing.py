"""Answers that always parse: per-sequence policies a ``Guide`` applies to its grammar mask.

* ``JsonBudget`` (json_object / json_schema): when the tokens left to ``max_tokens`` come
  close to what the shortest way to close the JSON needs, the mask keeps only that way, so
  the answer is a complete value when the budget runs out (finish reason "stop": it parses).
* ``ToolBudget`` (a list of tool calls, engine/formats/): a call that repeats an earlier one
  ends the answer (finish reason "stop"); after a call, another starts only if the tokens
  left can hold one as long as the longest so far, else the end token is forced; a call whose
  arguments are complete but whose closing tag would not fit ends the answer there ("stop").
* Both cap runs of whitespace inside JSON at ``WS_RUN`` characters, as llama.cpp's JSON
  grammar does: one-line JSON has no whitespace between tokens (engine/guidance.py), but a
  small model can still loop on spaces and newlines inside a string.

The shortest closing way is found greedily on a copy of the matcher: forced tokens first,
then the first allowed token of a short list of closers (``"}``, ``"``, ``}``, ``0``,
``null``...), then the smallest allowed token id. It is recomputed only as the budget nears
it (each check schedules the next one a quarter of the slack later), a few mask
computations of a few microseconds each. docs/tools.md, "Answers that always parse".
"""

from __future__ import annotations

import codecs
import logging
from typing import Any

import numpy as np

from ortserve.engine.formats import FALLBACK, FORMATS, LEAD, MUST, TOOL_MARK, ToolCallParser, ToolFormat

log = logging.getLogger(__name__)

# Tokens kept beyond the longest call so far before another call starts (ToolBudget).
MARGIN = 4
# The closing path is taken once it needs this many tokens fewer than are left: one sampled token
# can lengthen it by that much before the next check (in an object three deep, a "," took SmolLM2's
# shortest close from 2 tokens to 7: a key, ":", a value, three "}"). With 4 the answer was cut
# unclosed at max_tokens (test_tool_loops.py, json_object at seed 38 in a batch of 16).
CLOSE_AHEAD = 8
WS_RUN = 16  # longest run of whitespace characters inside JSON
CLOSERS = ('"}', '"]', '}}', '"', "}", "]", "]}", "}]", '""', "0", "{}", "[]", "null", "false", "true",
           ":", ",", " ", "a")


class Vocab:
    """What the policies need to know about one model's tokens (built once per ``Guidance``)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos = eos_ids[0]
        ids = [tokenizer.tokenize_str(s) for s in CLOSERS]
        self.closers = [t[0] for t in ids if len(t) == 1 and t[0] < vocab_size]
        self.closer_text = {t: tokenizer.decode_str([t]) for t in self.closers}
        blank = np.zeros(((vocab_size + 31) // 32) * 32, dtype=bool)
        for i in range(vocab_size):
            if i not in eos_ids and not tokenizer.is_special_token(i):
                text = tokenizer.decode_bytes([i])
                blank[i] = bool(text) and not text.strip()
        self.blank_bits = np.packbits(blank, bitorder="little").view(np.int32)  # whitespace-only tokens

    def text(self, token: int) -> bytes:
        return bytes(self.tokenizer.decode_bytes([token]))


def only(row: np.ndarray, token: int) -> None:
    """Make ``row`` (a packed bitmask) allow ``token`` alone."""
    row[:] = 0
    row[token // 32] = np.int32(np.uint32(1 << (token % 32)).view(np.int32))


def allowed(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


class JsonScan:
    """Where a JSON text stands, enough to estimate how many characters close it: open
    containers, an open string (a key or a value), a key waiting for its value."""

    def __init__(self) -> None:
        self.stack: list[str] = []  # "{" or "["
        self.in_str = self.esc = False
        self.key = False      # the open string, or the last closed one, is a key
        self.need = 0         # characters owed before the current container can close

    def copy(self) -> JsonScan:
        c = JsonScan()
        c.stack, c.in_str, c.esc, c.key, c.need = list(self.stack), self.in_str, self.esc, self.key, self.need
        return c

    def feed(self, text: str) -> JsonScan:
        for ch in text:
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif ch == "\\":
                    self.esc = True
                elif ch == '"':
                    self.in_str = False
                    self.need = 2 if self.key else 0  # a key owes ':' and a value
            elif ch == '"':
                self.in_str = True
                self.key = bool(self.stack) and self.stack[-1] == "{" and self.need in (0, 4)
                self.need = 0
            elif ch in "{[":
                self.stack.append(ch)
                self.need = 0
            elif ch in "}]":
                if self.stack:
                    self.stack.pop()
                self.need = 0
            elif ch == ":":
                self.need = 1
            elif ch == ",":
                self.need = 4 if self.stack and self.stack[-1] == "{" else 1  # '"":0' or '0'
            elif not ch.isspace():
                self.need = 0  # a number or literal goes on; any closer ends a number
        return self

    def cost(self) -> int:
        return len(self.stack) + self.need + (1 + (2 if self.key else 0) if self.in_str else 0)


def closing_path(matcher: Any, vocab: Vocab, limit: int, scan: JsonScan) -> list[int] | None:
    """A short token path from the matcher's state to an accepting one (None past ``limit``):
    forced tokens, else the allowed closer that leaves the least to close, else the smallest
    allowed token id."""
    m, scan = matcher.deep_copy(), scan.copy()
    path: list[int] = []
    while not m.is_accepting():
        if len(path) >= limit or m.is_error():
            return None
        ff = m.compute_ff_tokens()
        if ff:
            if not m.consume_tokens(ff):
                return None
            path += ff
            scan.feed(vocab.tokenizer.decode_str(ff))
            continue
        row = np.frombuffer(m.compute_bitmask(), dtype=np.int32)
        options = [(scan.copy().feed(vocab.closer_text[t]).cost(), i, t)
                   for i, t in enumerate(vocab.closers) if allowed(row, t)]
        if options:
            token = min(options)[2]
        else:
            bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab.vocab_size]
            bits[vocab.eos] = 0
            ids = np.flatnonzero(bits)
            if not ids.size:
                return None
            token = int(ids[0])
        if not m.consume_token(token):
            return None
        path.append(token)
        scan.feed(vocab.tokenizer.decode_str([token]))
    return path


class Policy:
    """What a guide does besides its grammar: adjust the mask, watch the tokens, maybe end."""

    def __init__(self, vocab: Vocab, max_tokens: int | None) -> None:
        self.vocab = vocab
        self.max_tokens = max_tokens
        self.used = 0
        self.ended = False           # the answer ends here (the engine finishes the sequence)
        self.finish_reason = "stop"  # why, when it does
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ws = 0                 # whitespace characters at the end of the text so far

    @property
    def left(self) -> int:
        """Tokens left, this one included (a large number without a budget)."""
        return (self.max_tokens - self.used) if self.max_tokens is not None else 1 << 30

    def adjust(self, matcher: Any, row: np.ndarray) -> None:
        raise NotImplementedError

    def observe(self, token: int, matcher: Any) -> str:
        """Count a consumed token; return its text (UTF-8 decoded incrementally)."""
        self.used += 1
        text = self._decoder.decode(self.vocab.text(token))
        stripped = text.rstrip()
        self._ws = self._ws + len(text) if not stripped else len(text) - len(stripped)
        return text

    def cap_whitespace(self, row: np.ndarray) -> None:
        """Past ``WS_RUN`` whitespace characters, no whitespace-only token (unless nothing else is allowed)."""
        if self._ws >= WS_RUN:
            kept = row & ~self.vocab.blank_bits[:row.size]
            if kept.any():
                row[:] = kept


class JsonBudget(Policy):
    """json_object / json_schema: close what is open before ``max_tokens`` runs out."""

    # The finish reason when the budget closed the answer: "stop", because it is complete (it parses
    # and matches the schema); "length" is kept for content that was cut and does not parse, as
    # OpenAI means it, so the openai SDK's parse() takes a closed answer (docs/tools.md, "The finish rule")
    closed_reason = "stop"
    closed_early = False      # the budget closed the answer (the server log says so per request)

    def __init__(self, vocab: Vocab, max_tokens: int | None) -> None:
        super().__init__(vocab, max_tokens)
        self.plan: list[int] | None = None  # the closing path being followed
        self.scan = JsonScan()
        self._check_at = self.left          # recompute the path once this few tokens are left

    def adjust(self, matcher: Any, row: np.ndarray) -> None:
        self.cap_whitespace(row)
        self.close_in_time(matcher, row)

    def close_in_time(self, matcher: Any, row: np.ndarray) -> None:
        """Near the end of the budget, keep only the shortest way to an accepting state."""
        if self.max_tokens is None:
            return
        left = self.left
        if self.plan is None and left <= self._check_at:
            path = closing_path(matcher, self.vocab, left, self.scan)
            if path is None:             # cannot close in time whatever happens: let it run
                self._check_at = left - 1
            elif path and len(path) + CLOSE_AHEAD >= left:
                self.plan = path
            else:
                self._check_at = left - max(1, (left - len(path) - CLOSE_AHEAD) // 4)
        if self.plan:
            only(row, self.plan[0])

    def observe(self, token: int, matcher: Any) -> str:
        text = super().observe(token, matcher)
        self.scan.feed(text)
        self.follow(token)
        return text

    def follow(self, token: int) -> None:
        if self.plan:
            if token != self.plan[0]:
                self.plan = None  # a penalty or bias took another token: find the way again
                self._check_at = self.left
            else:
                self.plan.pop(0)
                if not self.plan:
                    self.ended, self.finish_reason, self.closed_early = True, self.closed_reason, True
                    log.info("the answer was closed within max_tokens %s by the closing policy", self.max_tokens)


class ToolBudget(JsonBudget):
    """A list of tool calls: under ``required`` or a named tool (``must``) the first call closes
    within ``max_tokens`` (``JsonBudget``'s closing, envelope included), so the answer always
    holds a call that parses; a repeated call ends the list; no further call starts that the
    tokens left cannot hold."""

    def __init__(self, vocab: Vocab, max_tokens: int | None, fmt: ToolFormat = FALLBACK, lead: bool = False,
                 must: bool = False) -> None:
        super().__init__(vocab, max_tokens)
        self.parser = ToolCallParser(fmt, lead)
        self.must = must      # required or a named tool: the first call is closed in time
        self.longest = 0      # tokens of the longest call so far (its envelope included)
        self._last_end = 0    # tokens used when the last call ended
        self._between = False  # the text ends with a complete call

    def adjust(self, matcher: Any, row: np.ndarray) -> None:
        if self.parser.in_arguments:
            self.cap_whitespace(row)
        if self._between:
            if self.left < self.longest + MARGIN and allowed(row, self.vocab.eos):
                only(row, self.vocab.eos)  # another call would be cut: end the list here
        elif self.must and not self.longest:
            self.close_in_time(matcher, row)  # the first call ends in time

    def observe(self, token: int, matcher: Any) -> str:
        text = Policy.observe(self, token, matcher)
        before = len(self.parser.content)
        self.parser.feed(text)
        self.scan.feed(text)
        self.follow(token)
        if not self.parser.calls and len(self.parser.content) > before:  # prose before the first call
            self._last_end = self.used - (not self.parser.in_prose)  # is not part of the call's length
        if self.parser.repeated:
            self.ended = True  # finish "stop": the API layer answers "tool_calls"
        elif self.parser.in_envelope and len(matcher.compute_ff_tokens()) > self.left:
            self.ended = True  # the arguments are complete, the closing tag would not fit: the call stands
        ended_call = bool(self.parser.calls) and matcher.is_accepting()
        if ended_call and not self._between:
            self.longest = max(self.longest, self.used - self._last_end)
            self._last_end = self.used
        self._between = ended_call
        return text


def shortest_answer(matcher: Any, vocab: Vocab, limit: int) -> int | None:
    """Tokens of the shortest way the closing policies know from a fresh matcher to an accepting
    state (None past ``limit``): what a ``max_tokens`` must hold for the answer to parse."""
    path = closing_path(matcher, vocab, limit, JsonScan())
    return None if path is None else len(path)


def policy_for(kind: str, text: str, vocab: Vocab, max_tokens: int | None) -> Policy | None:
    """The policy for a constraint: JSON output, a tool-call list, or none (a user's regex or grammar)."""
    if kind == "json_schema":
        return JsonBudget(vocab, max_tokens)
    if kind == "grammar" and text.startswith(TOOL_MARK):
        name, *flags = text[len(TOOL_MARK):text.find("\n")].split() or [""]  # the first line names the syntax
        return ToolBudget(vocab, max_tokens, FORMATS.get(name, FALLBACK), LEAD in flags, MUST in flags)
    return None
