"""The one internal request and response-event stream under every chat-shaped wire API.

Each adapter in ``server/api/`` parses its own wire format into a :class:`ChatTurn` (OpenAI-style
plain messages, tools, an output format, sampling fields, n) and renders the events of a
:class:`Conversation` back into its own shapes. The work that every API shares happens here, once:

* which engine serves the model (the pinned one, a store model loaded on demand);
* sampling defaults (the model's, then the server's) and the max-token cap;
* tools and output constraints as one grammar (providers/structured.py), compiled up front so a bad
  schema is a 400 before anything runs;
* n independent choices, the tool-call parser per choice, usage with cached prompt tokens,
  metrics and the request's telemetry span.

The events are API-neutral: text deltas, a tool call's start and argument deltas, and a choice's
end with its finish reason ("stop", "length", "tool_calls") and metrics.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ortserve.engine import AsyncEngine, RequestHandle
from ortserve.engine.formats import ToolCallParser
from ortserve.engine.reasoning import UNBOUNDED, ReasoningSplitter
from ortserve.engine.tokenizer import TEMPLATE_HEADER
from ortserve.errors import InvalidRequest, OrtServeError
from ortserve.models.sampling import defaults_for
from ortserve.providers.structured import ToolPlan, constrain, plan_tools, response_constraint
from ortserve.server.protocol import _Sampling
from ortserve.server.service import collect, engine_error, submit_n
from ortserve.server.sse import merge
from ortserve.server.state import ServerState
from ortserve.server.vision import image_params, start_vision
from ortserve.types import Metrics


@dataclass
class ChatTurn:
    """What every chat-shaped API asks for, in one shape (OpenAI chat's, the lingua franca)."""

    messages: list[dict[str, Any]]
    model: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, top_k, stop, seed...
    max_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None                # [{"type": "function", "function": {...}}]
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None            # text | json_object | json_schema
    functions: list[Any] | None = None                      # OpenAI chat's legacy form, kept for it
    function_call: Any = None
    n: int = 1
    logprobs: int | None = None
    keep_alive: Any = None
    # max_tokens is a ceiling, not a demand (Anthropic clients send 32000 to every model): cut it to
    # the server's cap and to the room left in the context instead of refusing it
    max_tokens_is_ceiling: bool = False
    # this API's name for an internal field, so a 400 names what the client sent
    names: dict[str, str] = field(default_factory=dict)
    thinking: bool | None = None  # False: a thinking model answers without reasoning; True: it must think (None: its default)
    thinking_param: str | None = None  # the field that asked for False (None: the API's own default)
    # the most tokens a thinking model may reason before the engine closes its block (None: no bound)
    reasoning_budget: int | None = None
    # a raw prompt instead of the chat template (Ollama's raw, fill-in-the-middle): its token ids on the
    # engine that serves the turn (``messages`` are then not rendered)
    prompt_ids: Callable[[AsyncEngine], list[int]] | None = None


@dataclass
class TextDelta:
    choice: int
    text: str
    logprobs: list[Any] | None = None


@dataclass
class ReasoningDelta:
    """More of a thinking model's reasoning (engine/reasoning.py), before its answer."""

    choice: int
    text: str
    logprobs: list[Any] | None = None


@dataclass
class CallStart:
    choice: int
    index: int
    id: str
    name: str
    logprobs: list[Any] | None = None


@dataclass
class CallArguments:
    choice: int
    index: int
    arguments: str
    logprobs: list[Any] | None = None


@dataclass
class Finished:
    choice: int
    finish_reason: str          # stop | length | tool_calls (| function_call for the legacy form)
    metrics: Metrics
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    logprobs: list[Any] | None = None


Event = ReasoningDelta | TextDelta | CallStart | CallArguments | Finished


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass
class Choice:
    """A whole answer, for the non-streamed form."""

    text: str
    tool_calls: list[ToolCall]
    finish_reason: str
    metrics: Metrics
    stop_sequence: str | None = None
    logprobs: list[Any] | None = None
    reasoning: str = ""  # a thinking model's reasoning, apart from ``text``


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens: the reasoning's

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _renamed(err: InvalidRequest, names: dict[str, str]) -> InvalidRequest:
    """The same 400 with the field named as this API names it."""
    if err.param:
        head, _, rest = err.param.partition(".")
        if head in names:
            new = names[head] + (f".{rest}" if rest else "")
            err.message = err.message.replace(f"'{err.param}'", f"'{new}'").replace(f"'{head}'", f"'{names[head]}'")
            err.param = new
    return err


def prompt_plan(engine: AsyncEngine, turn: ChatTurn) -> tuple[ToolPlan | None, Any, bool | None, bool]:
    """The turn's tool plan, output constraint, thinking switch, and whether its answer is free text."""
    plan = plan_tools(turn)
    plan = plan.for_engine(engine) if plan is not None else None
    output = response_constraint(turn.response_format)
    # a thinking model reasons where its answer is free text (or prose before calls); under a
    # stricter grammar it answers directly, since the grammar has no room for reasoning
    calls = plan is not None and plan.calls_possible
    free = (output is None and not calls) or bool(calls and plan.mode == "auto" and plan.fmt.lead_prose)
    return plan, output, turn.thinking if free else False, free


async def count_prompt(st: ServerState, turn: ChatTurn) -> int:
    """The prompt tokens the turn would submit (its usage's prompt_tokens), without running it: the
    one count behind count_tokens, /v1/responses/input_tokens and /tokenize's ``messages``."""
    if images := image_params(turn.messages):   # the image tokens depend on each image's size: not counted yet
        raise InvalidRequest(f"'{images[0]}': counting the tokens of images is not served yet (docs/vision.md)",
                             param=images[0], code="images_not_counted")
    engine = await st.engine_for(turn.model, turn.keep_alive)
    try:
        plan, _, thinking, _ = prompt_plan(engine, turn)
    except InvalidRequest as err:
        raise _renamed(err, turn.names) from None
    return len(engine.codec.chat_ids(turn.messages, tools=plan.prompt_tools() if plan else None, thinking=thinking))


class Conversation:
    """One request running on a local engine: its choices' handles, its tool plan and its events."""

    def __init__(self, st: ServerState, engine: AsyncEngine, handles: list[RequestHandle],
                 plan: ToolPlan | None, headers: dict[str, str], turn: ChatTurn, span: Any) -> None:
        self.st = st
        self.engine = engine
        self.handles = handles
        self.plan = plan
        self.headers = headers
        self.turn = turn
        self.span = span
        self.model = engine.model_id
        # A small model that has its tool results tends to call the same tool again, forever. Under
        # `auto`, an answer whose calls were all made before (same name, same arguments) is replaced
        # by a text answer over the results it already has (tool_choice "none"): the loop ends.
        self.made = made_calls(turn.messages) if plan is not None and plan.mode == "auto" else set()
        self.thinking_open: bool | None = None  # split reasoning out: the answer starts inside a block
        self.reasoning = ["" for _ in handles]   # each choice's, for usage

    @classmethod
    async def start(cls, st: ServerState, turn: ChatTurn, span: Any) -> Conversation:
        """Pick the engine, fill sampling, plan tools and constraints, submit n choices."""
        try:
            sampling = _Sampling(model=turn.model, keep_alive=turn.keep_alive, **turn.sampling)
        except ValueError as exc:  # pydantic: a sampling field of the wrong type
            raise InvalidRequest(str(exc).splitlines()[-1]) from exc
        try:  # images, or a vision model: its batched engine, planned as below (server/vision.py)
            vision = await start_vision(st, turn, sampling, span, prompt_plan)
        except InvalidRequest as err:
            raise _renamed(err, turn.names) from None
        if vision is not None:
            return cls(st, vision[0], vision[1], vision[3], vision[2], turn, span)  # type: ignore[arg-type]
        engine = await st.engine_for(turn.model, sampling.keep_alive)
        if turn.thinking is False and turn.thinking_param and engine.codec.thinks and not engine.codec.thinking_switch:
            raise InvalidRequest(f"{engine.model_id} reasons in every answer: its chat template has no switch to turn "
                                 f"that off (enable_thinking), so '{turn.thinking_param}' cannot be honoured; leave it "
                                 "out (the reasoning comes back apart from the answer)", param=turn.thinking_param)
        if turn.thinking is True and turn.thinking_param and not engine.codec.thinks:
            raise InvalidRequest(f"{engine.model_id} does not think (its chat template writes no reasoning block), so "
                                 f"'{turn.thinking_param}' cannot be honoured", param=turn.thinking_param)
        span.set(model=engine.model_id, provider="local", execution_provider=engine.model.choice.device)
        try:
            defaults = defaults_for(st.settings, engine.model.dir)
            max_tokens = turn.max_tokens
            if turn.max_tokens_is_ceiling and max_tokens is not None:
                max_tokens = min(max_tokens, st.settings.max_tokens_cap)
            params = sampling.to_sampling_params(st.settings.default_max_tokens, st.settings.max_tokens_cap,
                                                 max_tokens, defaults)
            if turn.max_tokens_is_ceiling:
                params = replace(params, fit_context=True)
            headers = sampling.sampling_headers(params, defaults)
            plan, output, thinking, free = prompt_plan(engine, turn)
            params = constrain(engine, params, output, plan, thinking)
            if engine.codec.thinks and free and turn.prompt_ids is None:  # counted, and bounded if asked
                params = replace(params, reasoning_budget=UNBOUNDED if turn.reasoning_budget is None
                                 else turn.reasoning_budget)
        except InvalidRequest as err:
            raise _renamed(err, turn.names) from None
        params = replace(params, logprobs=turn.logprobs)
        if turn.prompt_ids is not None:
            try:
                handles = submit_n(engine, turn.n, params, prompt_ids=turn.prompt_ids(engine))
            except InvalidRequest as err:
                raise _renamed(err, turn.names) from None
        else:
            handles = submit_n(engine, turn.n, params, messages=turn.messages,
                               tools=plan.prompt_tools() if plan else None, thinking=thinking)
        if turn.prompt_ids is None and engine.codec.template_source != "model":
            headers = {**headers, TEMPLATE_HEADER: engine.codec.template_source}  # no template: ChatML, said so
        conv = cls(st, engine, handles, plan, headers, turn, span)
        if engine.codec.thinks and free and turn.prompt_ids is None:
            conv.thinking_open = engine.codec.answer_starts_thinking(thinking)
        return conv

    @property
    def prompt_tokens(self) -> int:
        return self.handles[0].input_tokens

    def usage(self, metrics: list[Metrics]) -> Usage:
        cached = max((getattr(m, "cached_tokens", 0) or 0 for m in metrics), default=0)
        counted = [m.reasoning_tokens for m in metrics]  # by the engine, markers left out
        thought = (sum(counted) if None not in counted and counted else  # type: ignore[arg-type]
                   sum(len(self.engine.codec.encode(r, add_special_tokens=False)) for r in self.reasoning if r))
        return Usage(self.prompt_tokens, sum(m.output_tokens for m in metrics), cached, thought)

    def _splitter(self) -> ReasoningSplitter | None:
        markers = self.engine.codec.reasoning_markers
        return ReasoningSplitter(self.thinking_open, markers) if self.thinking_open is not None and markers else None

    def _parser(self) -> ToolCallParser | None:
        return self.plan.parser() if self.plan else None

    def _finish(self, finish: str, parser: ToolCallParser | None) -> str:
        if parser is not None and parser.calls and finish == "stop":
            return "function_call" if self.plan and self.plan.legacy else "tool_calls"
        return finish

    def _repeats(self, calls: list[Any]) -> bool:
        return bool(self.made and calls) and all((c.name, canonical(c.arguments)) in self.made for c in calls)

    async def _in_text(self) -> Conversation:
        return await Conversation.start(self.st, replace(self.turn, tool_choice="none", n=1), self.span)

    async def events(self) -> AsyncIterator[Event]:
        """The choices' events as they are generated; an engine failure raises its OrtServeError."""
        parsers = [self._parser() for _ in self.handles]
        splitters = [self._splitter() for _ in self.handles]
        held: list[list[Any]] = [[] for _ in self.handles]  # logprobs of tokens whose text is not out yet
        calls: list[list[Event]] = [[] for _ in self.handles]  # held back while a call could be a repeat

        def take(i: int) -> list[Any] | None:
            lp, held[i] = held[i] or None, []
            return lp

        async for i, ev in merge(*self.handles):
            if ev.finish_reason == "error":
                raise engine_error(ev)
            held[i] += ev.logprobs or []
            parser, splitter, texts = parsers[i], splitters[i], [ev.text]
            if splitter is not None:  # reasoning first, the answer's text after it
                texts = []
                for thought, piece in splitter.feed(ev.text) + (splitter.finish() if ev.finished else []):
                    if thought:
                        self.reasoning[i] += piece
                        yield ReasoningDelta(i, piece, take(i))
                    else:
                        texts.append(piece)
            if parser is None:
                for piece in texts:
                    if piece:
                        yield TextDelta(i, piece, take(i))
            else:  # tool calls: their arguments go out as they are generated
                for d in [d for t in texts for d in parser.feed(t)] + (parser.finish() if ev.finished else []):
                    if d.index < 0 and d.content:
                        yield TextDelta(i, d.content, take(i))
                    elif d.index >= 0:
                        call: Event = (CallStart(i, d.index, d.call.id, d.call.name, take(i)) if d.call is not None
                                       else CallArguments(i, d.index, d.arguments, take(i)))
                        if self.made:
                            calls[i].append(call)
                        else:
                            yield call
            if ev.finished:
                self.st.record(self.span, ev.metrics, ev.finish_reason)
                finish = ev.finish_reason or "stop"
                if parser is not None and self._repeats(parser.calls):
                    async for again in (await self._in_text()).events():
                        again.choice = i
                        yield again
                    continue
                for call in calls[i]:
                    yield call
                yield Finished(i, self._finish(finish, parser), ev.metrics,  # type: ignore[arg-type]
                               ev.stop_sequence, take(i))

    async def choices(self, request: Any) -> list[Choice]:
        """Every choice whole; cancelled (and the engine work aborted) if the client leaves."""
        from ortserve.server.sse import unless_disconnected

        answers = await unless_disconnected(request, asyncio.gather(*(collect(h) for h in self.handles)))
        out = []
        for i, a in enumerate(answers):
            self.st.record(self.span, a.metrics, a.finish_reason)
            parser, splitter = self._parser(), self._splitter()
            text, calls, thought = a.text, [], ""
            if splitter is not None:
                splitter.feed(a.text)
                splitter.finish()
                text, thought = splitter.content, splitter.reasoning
                self.reasoning[i] = thought
            if parser is not None:
                parser.feed(text)
                parser.finish()
                text = parser.content
                calls = [ToolCall(c.id, c.name, c.arguments) for c in parser.calls]
            if parser is not None and self._repeats(parser.calls):
                out += await (await self._in_text()).choices(request)
                continue
            out.append(Choice(text, calls, self._finish(a.finish_reason, parser), a.metrics,
                              a.stop_sequence, a.logprobs, thought))
        return out

    def abort(self) -> None:
        for h in self.handles:
            self.engine.core.abort(h.id)


def canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


def made_calls(messages: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(name, arguments) of every tool call already in the conversation."""
    return {(c["function"].get("name"), canonical(c["function"].get("arguments", "")))
            for m in messages for c in m.get("tool_calls") or [] if isinstance(c.get("function"), dict)}


def error_of(exc: BaseException) -> OrtServeError:
    """Anything raised while streaming, as the error an adapter can render."""
    if isinstance(exc, OrtServeError):
        return exc
    return OrtServeError(f"generation failed: {exc}")
