"""The Responses API's input side: input items as plain chat messages (a reasoning item's text
goes with the assistant turn after it), function and namespace tools, tool_choice and text.format
in the shapes the conversation layer takes."""

from __future__ import annotations

import uuid
from typing import Any

from ortserve.errors import InvalidRequest
from ortserve.server.hosted_tools import OPENAI_OFFLINE

# Tools the client runs in a syntax these models do not speak: a 400 names them. The hosted tools
# (web_search, file_search...) are server/hosted_tools.py's: left out with a warning, or run locally.
BUILT_IN = {"local_shell", "shell", "apply_patch", "custom"}
HOSTED = OPENAI_OFFLINE | {"file_search"}
# output items of hosted tools that a client sends back in its history: the model's context has them
# already (the search results were given to it), so they add no message
HOSTED_ITEMS = {"file_search_call", "web_search_call", "image_generation_call", "code_interpreter_call",
                "computer_call", "mcp_call", "mcp_list_tools"}


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}' must be a string or a list of content parts", param=where)
    parts = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(p.get("text"), str):
            raise InvalidRequest(f"'{where}.{j}.type' {kind!r} is not supported (text parts only)",
                                 param=f"{where}.{j}.type")
        parts.append(p["text"])
    return "".join(parts)


def _content_of(content: Any, where: str) -> Any:
    """A message's content: its text, or text and image parts where it has input_image parts."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "input_image"
                                                for p in content):
        return _text_of(content, where)
    from ortserve.server.vision import image_part

    parts: list[dict[str, Any]] = []
    for j, p in enumerate(content):
        if isinstance(p, dict) and p.get("type") == "input_image":
            if not isinstance(p.get("image_url"), str):
                raise InvalidRequest(f"'{where}.{j}.image_url' is needed: a data:image/...;base64,... URL "
                                     "(file_id images are not served)", param=f"{where}.{j}.image_url")
            parts.append(image_part(p["image_url"], f"{where}.{j}.image_url"))
        else:
            parts.append({"type": "text", "text": _text_of([p], f"{where}.{j}")})
    return parts


def messages_of(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as plain chat messages; consecutive function calls join one assistant turn."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    thought = ""  # a reasoning item's text, for the assistant turn after it (a thinking model's template)
    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequest(f"'{where}.role' must be user, assistant, system or developer", param=f"{where}.role")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _content_of(item.get("content", ""), f"{where}.content")})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments"), str):
                raise InvalidRequest(f"'{where}' needs 'name' and 'arguments' (a JSON string)", param=where)
            call = {"id": item.get("call_id") or item.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            elif out and out[-1]["role"] == "assistant" and not thought:
                out[-1]["tool_calls"] = [call]  # a message item, then its calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind in HOSTED_ITEMS:
            continue
        elif kind == "reasoning":  # the text of a thinking model's reasoning item; an encrypted one has none
            thought += "".join(p.get("text", "") for p in item.get("content") or []
                               if isinstance(p, dict) and p.get("type") == "reasoning_text")
            continue
        else:
            raise InvalidRequest(f"'{where}.type' {kind!r} is not supported (message, function_call, "
                                 "function_call_output)", param=f"{where}.type")
        if thought and kind in ("message", "function_call") and out[-1]["role"] == "assistant":
            out[-1]["reasoning_content"], thought = thought, ""
    return out


def namespaces_of(tools: list[dict[str, Any]] | None) -> dict[str, str]:
    """Function name -> its namespace, for the tools declared inside a ``namespace`` tool."""
    return {f.get("name"): t.get("name") for t in tools or [] if isinstance(t, dict) and t.get("type") == "namespace"
            for f in t.get("tools") or [] if isinstance(f, dict)}


def flat(tools: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(where, tool) pairs with a namespace's functions in its place (the model sees plain functions)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i, t in enumerate(tools):
        if isinstance(t, dict) and t.get("type") == "namespace":
            out += [(f"tools.{i}.tools.{j}", f) for j, f in enumerate(t.get("tools") or [])]
        else:
            out.append((f"tools.{i}", t))
    return out


def tools_of(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for where, t in flat(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind in HOSTED:  # not offered to the model (responses_hosted.py)
            continue
        if kind in BUILT_IN:
            raise InvalidRequest(f"the built-in tool {kind!r} is not supported by ortserve (the served models "
                                 "have no syntax for it); declare a function tool instead", param=f"{where}.type",
                                 code="unsupported_parameter")
        if kind != "function":
            raise InvalidRequest(f"'{where}.type' must be 'function' or 'namespace'", param=f"{where}.type")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                      if k in t}})
    return out


def choice_of(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict) and choice.get("type") == "file_search":
        return "auto"  # the search runs before the model answers (server/hosted_tools.py)
    return choice


def format_of(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
