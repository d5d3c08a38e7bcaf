r"""Thinking models (Qwen3, QwQ, DeepSeek-R1 distills): their answers begin with reasoning between
``<think>`` and ``</think>``, which every API returns apart from the answer, as llama-server and vLLM
do (Chat Completions ``reasoning_content``, a Responses ``reasoning`` item, a Messages ``thinking``
block).

A model thinks when its chat template writes both markers. Some templates open the block in the
generation prompt (DeepSeek-R1's ``<think>\n``), so the answer starts inside it; Qwen3's closes an
empty one when ``enable_thinking`` is false, so the answer has none. ``ReasoningSplitter`` splits the
generated text as it streams: blank text around the reasoning is dropped, and the markers are never
part of either side.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def thinks(template: str | None) -> bool:
    """Whether a chat template speaks the ``<think>`` syntax."""
    return bool(template) and OPEN in template and CLOSE in template  # type: ignore[operator]


def left_open(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a ``<think>`` block (the answer starts with reasoning)."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (it may be cut mid-marker)."""
    return next((k for k in range(min(len(text), len(marker) - 1), 0, -1) if text.endswith(marker[:k])), 0)


class ReasoningSplitter:
    """Generated text in, ``(is_reasoning, text)`` pieces out, as it arrives."""

    def __init__(self, inside: bool = False) -> None:
        self.state = "inside" if inside else "start"  # start | inside | after_think | answer
        self.reasoning = ""
        self.content = ""
        self._buf = ""

    def feed(self, text: str) -> list[tuple[bool, str]]:
        self._buf += text
        out: list[tuple[bool, str]] = []
        while True:
            before = (self.state, len(self._buf))
            self._step(out)
            if (self.state, len(self._buf)) == before:
                return out

    def finish(self) -> list[tuple[bool, str]]:
        """The end of generation: an unclosed block is all reasoning (cut by max_tokens)."""
        out: list[tuple[bool, str]] = []
        buf, self._buf = self._buf, ""
        if self.state == "inside" and buf.strip():
            self._emit(out, True, buf.rstrip() if self.reasoning else buf.strip())
        elif self.state in ("start", "answer") and buf:
            self._emit(out, False, buf)
        return out

    def _emit(self, out: list[tuple[bool, str]], reasoning: bool, text: str) -> None:
        if text:
            if reasoning:
                self.reasoning += text
            else:
                self.content += text
            out.append((reasoning, text))

    def _step(self, out: list[tuple[bool, str]]) -> None:
        buf = self._buf
        if self.state == "start":  # does the answer open a block (after blank text)?
            lead = buf.lstrip()
            if lead.startswith(OPEN):
                self._buf, self.state = lead[len(OPEN):], "inside"
            elif not OPEN.startswith(lead):
                self.state = "answer"
        elif self.state == "inside":
            end = buf.find(CLOSE)
            if end >= 0:
                self._emit(out, True, buf[:end].rstrip() if self.reasoning else buf[:end].strip())
                self._buf, self.state = buf[end + len(CLOSE):], "after_think"
                return
            # hold back what may begin the close marker and the blank text that may precede it;
            # drop blank text before any reasoning
            ready = buf[:len(buf) - _partial(buf, CLOSE)]
            lead = 0 if self.reasoning else len(ready) - len(ready.lstrip())
            body = ready[lead:].rstrip()
            self._emit(out, True, body)
            self._buf = buf[lead + len(body):]
        elif self.state == "after_think":  # the blank text between the block and the answer
            if buf.strip():
                self._buf, self.state = buf.lstrip(), "answer"
        elif buf:
            self._emit(out, False, buf)
            self._buf = ""
