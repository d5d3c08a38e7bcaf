"""What /openapi.json publishes beyond the pydantic types: the bounds, lengths and shapes that the
validation already enforces in code (``ortserve.types.SamplingParams.validate``, the routes' own
checks), so a client or a fuzzer generating bodies from the document sends what is accepted
(issue 45, docs/robustness.md).

Every fragment here is publish-only (pydantic's ``json_schema_extra``, merged into the field's
schema): the checks stay where they are, with their messages and the field they name. A fragment
that sets ``anyOf`` replaces the generated one; tests/integration/test_openapi_published.py pins a
few of them against the validation.
"""

from __future__ import annotations

from typing import Any

NONBLANK = r"\S"  # a string with at least one non-whitespace character (blank ones are a 400)


def between(lo: float | None = None, hi: float | None = None, *, open_lo: bool = False) -> dict[str, Any]:
    """A number's published range: ``[lo, hi]``, or ``(lo, hi]`` with ``open_lo``."""
    out: dict[str, Any] = {}
    if lo is not None:
        out["exclusiveMinimum" if open_lo else "minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return out


def nullable(*schemas: dict[str, Any]) -> dict[str, Any]:
    """``anyOf`` the given schemas or null (an optional field whose null means "left out")."""
    return {"anyOf": [*schemas, {"type": "null"}]}


def text(**kw: Any) -> dict[str, Any]:
    return {"type": "string", "pattern": NONBLANK, **kw}


def one_of_required(*names: str) -> dict[str, Any]:
    """A body that must carry at least one of ``names`` (e.g. Ollama's ``model`` or its older ``name``)."""
    return {"anyOf": [{"required": [n]} for n in names]}


# server/slots.parse_keep_alive: seconds (a number), or a number with ms, s, m or h
KEEP_ALIVE = nullable({"type": "number"},
                      {"type": "string", "pattern": r"^\s*-?\d+(\.\d+)?([mM][sS]|[sSmMhH])?\s*$"})

# SamplingParams.validate's ranges (ortserve/types.py), for the OpenAI-shaped sampling fields
SAMPLING: dict[str, dict[str, Any]] = {
    "temperature": between(0, 2),
    "top_p": between(0, 1, open_lo=True),
    "top_k": between(0),
    "min_p": between(0, 1),
    "typical_p": between(0, 1, open_lo=True),
    "max_tokens": between(1),
    "min_tokens": between(0),
    "seed": {"minimum": -2**63, "exclusiveMaximum": 2**64},
    "repetition_penalty": between(0, 10, open_lo=True),
    "presence_penalty": between(-2, 2),
    "frequency_penalty": between(-2, 2),
    "lora_scale": between(-10, 10),
    "stop": nullable({"type": "string", "minLength": 1},
                     {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4}),
    "logit_bias": nullable({"type": "object", "maxProperties": 1024,
                            "propertyNames": {"pattern": r"^\d+$"},
                            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}),
}


def embed_input(most: int) -> dict[str, Any]:
    """An embeddings ``input``: a non-blank string, or 1..``most`` of them, or token-id arrays (ids
    >= 0; the model's vocabulary bounds them above), none empty."""
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    return {"anyOf": [text(), {"type": "array", "items": text(), "minItems": 1, "maxItems": most},
                      {**ids, "maxItems": most}, {"type": "array", "items": ids, "minItems": 1, "maxItems": most}]}


# rerank: without rank_fields a document is a string or an object with a string ``text``; with
# rank_fields every document is an object (holding those fields as strings)
RERANK_DOCUMENTS: dict[str, Any] = {"anyOf": [
    {"properties": {"rank_fields": {"type": "null"}, "documents": {"items": {"anyOf": [
        {"type": "string"},
        {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}]}}}},
    {"required": ["rank_fields"], "properties": {"rank_fields": {"type": "array"},
                                                 "documents": {"items": {"type": "object"}}}}]}


def _block(kind: str, **props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["type", *props],
            "properties": {"type": {"const": kind}, **props}}


_TEXT_BLOCK = _block("text", text={"type": "string"})
_TEXT_BLOCKS = {"type": "array", "items": _TEXT_BLOCK}
_REDACTED = _block("redacted_thinking")


def _turn(role: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["role", "content"],
            "properties": {"role": {"const": role},
                           "content": {"anyOf": [{"type": "string"},
                                                 {"type": "array", "items": {"anyOf": list(blocks)}}]}}}


# Anthropic Messages (server/api/anthropic_messages.py messages_of, choice_of, _check): the turns
# and content blocks each role may carry, and the enums checked in code
ANTHROPIC: dict[str, dict[str, Any]] = {
    "messages": {"items": {"anyOf": [
        _turn("user", _TEXT_BLOCK, _REDACTED,
              _block("image", source={"anyOf": [
                  {"type": "object", "required": ["type", "data"],
                   "properties": {"type": {"const": "base64"}, "data": {"type": "string"}}},
                  {"type": "object", "required": ["type", "url"],   # file:// under ORTSERVE_IMAGE_DIR
                   "properties": {"type": {"const": "url"}, "url": {"type": "string"}}}]}),
              _block("tool_result", content={"anyOf": [{"type": "string"}, _TEXT_BLOCKS]})),
        _turn("assistant", _TEXT_BLOCK, _REDACTED, _block("tool_use", id={"type": "string"}, name={"type": "string"}),
              _block("thinking", thinking={"type": "string"})),
        _turn("system", _TEXT_BLOCK)]}},
    "system": nullable({"type": "string"}, _TEXT_BLOCKS),
    "tool_choice": nullable({"type": "object", "required": ["type"],
                             "properties": {"type": {"enum": ["auto", "any", "tool", "none"]}}}),
    "thinking": nullable({"type": "object", "anyOf": [
        {"required": ["type"], "properties": {"type": {"enum": ["disabled", "adaptive"]}}},
        {"required": ["type", "budget_tokens"],
         "properties": {"type": {"const": "enabled"}, "budget_tokens": {"type": "integer", "minimum": 0}}}]}),
    "output_config": nullable({"type": "object", "additionalProperties": False,
                               "properties": {"effort": {"enum": ["low", "medium", "high", "max", None]},
                                              "format": nullable({"type": "object", "required": ["type"], "properties": {
                                                  "type": {"const": "json_schema"}, "schema": {"type": "object"}}})}}),
    "stop_sequences": SAMPLING["stop"]["anyOf"][1] | {"type": ["array", "null"]},
    # "", "auto" and "router" name the router, which serves /v1/chat/completions only (_check)
    "model": {"minLength": 1, "not": {"pattern": "^([aA][uU][tT][oO]|[rR][oO][uU][tT][eE][rR])$"}},
    # a custom tool (with input_schema) or one of Anthropic's server tools (dropped offline)
    "tools": nullable({"type": "array", "items": {"type": "object", "anyOf": [
        {"required": ["input_schema"]}, {"required": ["type"], "properties": {"type": {
            "type": "string", "pattern": "^(web_search_|web_fetch_|code_execution_)"}}}]}}),  # hosted_tools.py
    "top_p": SAMPLING["top_p"], "top_k": SAMPLING["top_k"], "lora_scale": SAMPLING["lora_scale"],
}


# Ollama (server/api/ollama_wire.py): a model named as ``model`` or ``name``; a new name as the store
# takes it (models/store.validate_name, optionally with one ':tag'); embeddings take no options
OLLAMA_NAMED = {"anyOf": [{"required": [n], "properties": {n: {"type": "string"}}} for n in ("model", "name")]}
_ID = "[a-z0-9][a-z0-9._-]{0,63}"
NEW_NAME = {"allOf": [{"pattern": f"^{_ID}(:{_ID})?$"}, {"not": {"pattern": r"\.\.|--"}}]}
OLLAMA_CREATE = {"allOf": [
    OLLAMA_NAMED, {"required": ["from"], "properties": {"from": {"type": "string"}}},
    {"properties": {n: nullable({"type": "string", **NEW_NAME}) for n in ("model", "name")}}]}
NO_OPTIONS = nullable({"type": "object", "maxProperties": 0})
OLLAMA_INPUT = {"anyOf": [text(), {"type": "array", "items": text(), "minItems": 1, "maxItems": 2048}]}


def multipart(required: list[str], file_types: str, **props: dict[str, Any]) -> dict[str, Any]:
    """An ``openapi_extra`` for a route that reads its multipart form itself (no pydantic body):
    the form's fields as the route checks them (unknown fields are a 400), and the media types its
    ``file`` may have (``encoding``)."""
    schema = {"type": "object", "required": required, "additionalProperties": False, "properties": props}
    form = {"schema": schema, "encoding": {"file": {"contentType": file_types}}}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": form}}}


FILE = {"type": "string", "format": "binary"}
