r"""Thinking models (Qwen3, QwQ, DeepSeek-R1 distills; Magistral and Ministral 3 Reasoning): their
answers begin with reasoning between ``<think>`` and ``</think>`` (Mistral's: ``[THINK]`` and
``[/THINK]``, special tokens the decoder keeps for them), which every API returns apart from the
answer, as llama-server and vLLM do (Chat Completions ``reasoning_content``, a Responses
``reasoning`` item, a Messages ``thinking`` block).

A model thinks when its chat template writes both markers of a pair. Some templates open the block in the
generation prompt (DeepSeek-R1's ``<think>\n``), so the answer starts inside it; Qwen3's closes an
empty one when ``enable_thinking`` is false, so the answer has none. ``ReasoningSplitter`` splits the
generated text as it streams: blank text around the reasoning is dropped, and the markers are never
part of either side.
"""

from __future__ import annotations

from ortserve.engine.detokenize import marker_start

OPEN, CLOSE = "<think>", "</think>"
MISTRAL = ("[THINK]", "[/THINK]")
MARKERS = ((OPEN, CLOSE), MISTRAL)


def markers_of(template: str | None) -> tuple[str, str] | None:
    """The reasoning markers a chat template writes, or None: the model does not think."""
    return next((pair for pair in MARKERS if template and pair[0] in template and pair[1] in template), None)


def thinks(template: str | None) -> bool:
    """Whether a chat template speaks a reasoning syntax."""
    return markers_of(template) is not None


def left_open(prompt: str, markers: tuple[str, str] = (OPEN, CLOSE)) -> bool:
    """Whether a rendered prompt ends inside a reasoning block (the answer starts with reasoning)."""
    return prompt.rfind(markers[0]) > prompt.rfind(markers[1])


class ReasoningSplitter:
    """Generated text in, ``(is_reasoning, text)`` pieces out, as it arrives."""

    def __init__(self, inside: bool = False, markers: tuple[str, str] = (OPEN, CLOSE)) -> None:
        self.state = "inside" if inside else "start"  # start | inside | after_think | answer
        self.open, self.close = markers
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
            if lead.startswith(self.open):
                self._buf, self.state = lead[len(self.open):], "inside"
            elif not self.open.startswith(lead):
                self.state = "answer"
        elif self.state == "inside":
            end = buf.find(self.close)
            if end >= 0:
                self._emit(out, True, buf[:end].rstrip() if self.reasoning else buf[:end].strip())
                self._buf, self.state = buf[end + len(self.close):], "after_think"
                return
            # hold back what may begin the close marker and the blank text that may precede it;
            # drop blank text before any reasoning
            ready = buf[:len(buf) - marker_start(buf, self.close)]
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
