"""Tools and response_format on the wire: from request fields to a grammar on SamplingParams,
and from generated text back to OpenAI messages, chunks and finish reasons."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ortserve.engine import AsyncEngine
from ortserve.engine.formats import FALLBACK, Delta, Tool, ToolCallParser, ToolFormat
from ortserve.engine.guidance import Constraint
from ortserve.engine.tools import parse_choice, parse_function, parse_tools
from ortserve.errors import InvalidRequest
from ortserve.types import SamplingParams


@dataclass(frozen=True)
class ToolPlan:
    tools: list[Tool]
    mode: str            # none | auto | required | a tool name
    parallel: bool
    legacy: bool = False  # from functions/function_call: answer with message.function_call
    fmt: ToolFormat = FALLBACK  # the model's tool-call syntax (engine/formats/), set by ``for_engine``

    @property
    def calls_possible(self) -> bool:
        return self.mode != "none"

    def prompt_tools(self) -> list[Tool] | None:
        """Under 'none' the tools are not described to the model (it could not call them)."""
        return self.tools if self.calls_possible else None

    def parser(self) -> ToolCallParser | None:
        return ToolCallParser(self.fmt) if self.calls_possible else None

    def for_engine(self, engine: AsyncEngine) -> ToolPlan:
        """This plan in the syntax of the engine's model (its template's, engine/formats/registry.py)."""
        return replace(self, fmt=engine.codec.tool_format)


def plan_tools(body: Any) -> ToolPlan | None:
    """tools/tool_choice/parallel_tool_calls, or the legacy functions/function_call."""
    if body.functions is not None or body.function_call is not None:
        if body.tools is not None or body.tool_choice is not None:
            raise InvalidRequest("give 'tools' or the legacy 'functions', not both", param="functions")
        tools = [parse_function(f, f"functions.{i}") if isinstance(f, dict) else _bad_function(i)
                 for i, f in enumerate(body.functions or [])]
        fc = body.function_call
        choice = {"type": "function", "function": fc} if isinstance(fc, dict) else fc
        mode = parse_choice(choice, tools, param="function_call")
        return ToolPlan(tools, mode, parallel=False, legacy=True)
    if body.tools is None and body.tool_choice is None:
        if body.parallel_tool_calls is not None:
            raise InvalidRequest("'parallel_tool_calls' needs 'tools'", param="parallel_tool_calls")
        return None
    tools = parse_tools(body.tools)
    mode = parse_choice(body.tool_choice, tools)
    parallel = True if body.parallel_tool_calls is None else bool(body.parallel_tool_calls)
    return ToolPlan(tools, mode, parallel)


def _bad_function(i: int) -> Tool:
    raise InvalidRequest(f"'functions.{i}' must be an object", param=f"functions.{i}")


def response_constraint(rf: Any, param: str = "response_format") -> Constraint | None:
    """OpenAI response_format: text | json_object | json_schema {name, schema, strict}."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidRequest(f"'{param}.type' must be 'text', 'json_object' or 'json_schema'", param=f"{param}.type")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return Constraint.json_schema({"type": "object"}, param=param)
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidRequest(f"'{param}.json_schema' must be an object with a 'name' and a 'schema'",
                             param=f"{param}.json_schema")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}.json_schema.schema' must be a JSON schema object",
                             param=f"{param}.json_schema.schema")
    return Constraint.json_schema(schema, param=f"{param}.json_schema.schema")


def constrain(engine: AsyncEngine, params: SamplingParams, constraint: Constraint | None,
              plan: ToolPlan | None = None, thinking: bool | None = None) -> SamplingParams:
    """SamplingParams with the request's grammar, compiled now so a bad one is a 400 naming its field.
    Under ``auto``, a thinking model's reasoning block may come before the answer (``thinking``: as
    the prompt is rendered)."""
    if plan is not None and plan.calls_possible:
        if constraint is not None:
            raise InvalidRequest("'response_format' cannot be combined with tools unless tool_choice is 'none'",
                                 param="response_format")
        think = engine.codec.think_lark(thinking) if plan.mode == "auto" else None
        grammar = plan.fmt.grammar(plan.tools, plan.mode, plan.parallel, think)
        constraint = Constraint("grammar", grammar or "", "functions" if plan.legacy else "tools")
    if constraint is None:
        return params
    if params.json_schema or params.regex or params.grammar:
        raise InvalidRequest("give one output constraint", param=constraint.param)
    engine.guidance.guide(constraint)  # compile (cached by content hash) or 400
    if plan is not None and plan.calls_possible and plan.mode != "auto" and params.max_tokens is not None:
        _call_fits(engine, constraint, params.max_tokens)
    if constraint.kind == "json_schema":
        return replace(params, json_schema=constraint.text)
    return replace(params, **{constraint.kind: constraint.text})


def _call_fits(engine: AsyncEngine, constraint: Constraint, max_tokens: int) -> None:
    """``required`` or a named tool means a call: a budget that cannot hold the shortest one is a
    400 now, not an answer without a call later."""
    need = engine.guidance.shortest(constraint)
    if need is not None and need > max_tokens:
        raise InvalidRequest(f"max_tokens {max_tokens} cannot hold a tool call: the shortest call this "
                             f"tool_choice allows takes {need} tokens", param="max_tokens")


def message_of(text: str, finish_reason: str, plan: ToolPlan | None) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason for a whole answer."""
    parser = plan.parser() if plan else None
    if parser is None:
        return {"role": "assistant", "content": text}, finish_reason
    parser.feed(text)
    parser.finish()
    if not parser.calls:
        return {"role": "assistant", "content": parser.content}, finish_reason
    if plan and plan.legacy:
        c = parser.calls[0]
        return ({"role": "assistant", "content": None,
                 "function_call": {"name": c.name, "arguments": c.arguments}},
                "function_call" if finish_reason == "stop" else finish_reason)
    return ({"role": "assistant", "content": parser.content or None,
             "tool_calls": [c.as_openai() for c in parser.calls]},
            "tool_calls" if finish_reason == "stop" else finish_reason)


def delta_of(d: Delta, legacy: bool = False) -> dict[str, Any]:
    """One streamed piece as an OpenAI chunk delta."""
    if d.index < 0:
        return {"content": d.content}
    if legacy:
        fn = {"name": d.call.name, "arguments": ""} if d.call else {"arguments": d.arguments}
        return {"function_call": fn}
    if d.call is not None:
        return {"tool_calls": [{"index": d.index, "id": d.call.id, "type": "function",
                                "function": {"name": d.call.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.arguments}}]}


def _token(codec: Any, token_id: int) -> dict[str, Any]:
    text = codec.decode([token_id])
    return {"token": text, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(codec: Any, entries: list[Any] | None) -> dict[str, Any] | None:
    """OpenAI chat ``logprobs``: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    if entries is None:
        return None
    return {"content": [{**_token(codec, t), "logprob": lp,
                         "top_logprobs": [{**_token(codec, a), "logprob": alp} for a, alp in alts]}
                        for t, lp, alts in entries], "refusal": None}


def completion_logprobs(codec: Any, entries: list[Any] | None, offset: int = 0) -> dict[str, Any] | None:
    """OpenAI completions ``logprobs``: parallel lists of tokens, logprobs, top alternatives, offsets."""
    if entries is None:
        return None
    tokens = [codec.decode([t]) for t, _, _ in entries]
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
            "top_logprobs": [{codec.decode([a]): alp for a, alp in alts} for _, _, alts in entries],
            "text_offset": offsets}
