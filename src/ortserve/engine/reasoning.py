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

``ThinkBudget`` bounds a sequence's reasoning (llama-server's ``--reasoning-budget``, vLLM's
``thinking_token_budget``): it counts the tokens written inside the block and, once the budget is
spent, forces the close marker's tokens, after which the model writes its answer (docs/reasoning.md).
"""

from __future__ import annotations

from collections.abc import Callable

from ortserve.engine.detokenize import marker_start

OPEN, CLOSE = "<think>", "</think>"
MISTRAL = ("[THINK]", "[/THINK]")
MARKERS = ((OPEN, CLOSE), MISTRAL)

# Reasoning tokens per effort level (Chat Completions ``reasoning_effort``, Responses ``reasoning.effort``,
# Ollama's ``think`` levels); None: no bound. "none" turns thinking off instead (docs/reasoning.md).
EFFORT_BUDGETS: dict[str, int | None] = {"minimal": 128, "low": 512, "medium": 2048, "high": 8192, "xhigh": None}
UNBOUNDED = -1  # SamplingParams.reasoning_budget: count the reasoning tokens, never close the block


def effort_budget(effort: str | None) -> int | None:
    """The reasoning budget of an effort level (None: unbounded, or no level given)."""
    return EFFORT_BUDGETS.get(effort) if effort else None


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


class ThinkBudget:
    """One sequence's reasoning budget: the tokens written inside its reasoning block are counted
    (``used``; the markers are not), and once ``budget`` are spent the close marker's tokens are
    forced one by one (``forced``), as ``engine/closing.py``'s JSON budget follows its closing path:
    a token other than the planned one (a ban, a grammar) drops the plan, and the next step plans
    again. After the block the model writes its answer as usual. ``budget`` < 0: count only."""

    def __init__(self, budget: int, close_ids: list[int], piece: Callable[[int], str],
                 markers: tuple[str, str] = (OPEN, CLOSE), inside: bool = False) -> None:
        self.budget = budget
        self.close_ids = list(close_ids)
        self.piece = piece                 # one token's text, special tokens included
        self.split = ReasoningSplitter(inside, markers)
        self.used = 0                      # tokens written inside the block
        self.closed_early = False          # the budget closed the block
        self._plan: list[int] = []

    @property
    def inside(self) -> bool:
        return self.split.state == "inside"

    def forced(self) -> int | None:
        """The token the next step must take (the close marker's next token), or None."""
        if not self._plan and not self.closed_early and self.inside and 0 <= self.budget <= self.used and self.close_ids:
            self._plan = list(self.close_ids)
        return self._plan[0] if self._plan else None

    def observe(self, token: int) -> None:
        """Count a generated token (after it was taken)."""
        planned = bool(self._plan) and token == self._plan[0]
        if planned:
            self._plan.pop(0)
        elif self._plan:
            self._plan = []
        was_inside = self.inside
        self.split.feed(self.piece(token))
        if planned and not self._plan:
            self.closed_early = True
        elif was_inside and self.inside and not planned:
            self.used += 1
