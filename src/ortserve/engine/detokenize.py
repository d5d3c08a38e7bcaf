"""Streaming text out of token ids: UTF-8 safe deltas and stop strings cut across tokens."""

from __future__ import annotations

from collections.abc import Callable


class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas, never splitting a character.

    Decodes a short window before the new ids (so tokenizers that merge spaces or byte
    pieces across token boundaries decode the same as a full decode), and holds back text
    while it ends in U+FFFD, i.e. while a multi-byte character is incomplete.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix = 0   # start of the context window
        self._read = 0     # ids already turned into text

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        full = self._decode(self.ids[self._prefix:])
        if len(full) > len(prefix_text) and not full.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return full[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """Whatever is held back at the end of generation."""
        if self._read == len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        full = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return full[len(prefix_text):]


def marker_start(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could begin ``marker`` (text that streamed output
    holds back until the next piece shows whether the marker comes)."""
    return next((k for k in range(min(len(text), len(marker) - 1), 0, -1) if text.endswith(marker[:k])), 0)


class StopMatcher:
    """Cuts output at the first stop string, also when it spans several deltas.

    Holds back the last ``longest stop - 1`` characters, which could be the start of a stop
    string, until the next delta shows whether they are.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buffer = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the output

    def feed(self, delta: str) -> str:
        if not self.stops:
            return delta
        self.buffer += delta
        cut = min((i for i in (self.buffer.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self.matched = min((self.buffer.find(s), s) for s in self.stops if s in self.buffer)[1]
            out, self.buffer = self.buffer[:cut], ""
            return out
        if len(self.buffer) <= self.hold:
            return ""
        out, self.buffer = self.buffer[:len(self.buffer) - self.hold], self.buffer[len(self.buffer) - self.hold:]
        return out

    def flush(self) -> str:
        out, self.buffer = self.buffer, ""
        return out
