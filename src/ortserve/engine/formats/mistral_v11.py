"""Mistral's templates from tokenizer v11 on (Mistral Small 3.2, Devstral, Magistral, Ministral 3):
the name before the arguments, one ``[TOOL_CALLS]`` per call, nothing between calls::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

Mistral Small 3.2's template writes a call's id between the two (``name[CALL_ID]a1B2c3D4e[ARGS]{…}``)
in the history; the grammar leaves the id out, as Devstral's and Ministral 3's templates do and as
llama.cpp's grammar allows (its ``[CALL_ID]`` section is optional), and the parser reads it when a
model writes one. Results come back as ``[TOOL_RESULTS]…[/TOOL_RESULTS]``.

The markers are special tokens in these vocabularies, so a decoder that skips them turns the calls
into ``get_weather{"city": "Paris"}get_time{}``: a call is then a run of name characters followed
by ``{``, and prose under ``auto`` is kept from beginning that way (``prose``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ortserve.engine.formats.base import Tool, ToolFormat
from ortserve.engine.formats.mistral import with_short_ids

NAME = "A-Za-z0-9_\\-"  # what a tool's name is made of (engine/tools.py checks names)
HEAD = re.compile(rf"(?:\[TOOL_CALLS\])?([{NAME}]{{1,64}})(?:\[CALL_ID\]([A-Za-z0-9]{{1,64}}))?(?:\[ARGS\])?")
MAY_BE_HEAD = re.compile(rf"[{NAME}\[\]]{{0,160}}")  # markers, a name and an id, before the arguments' "{"


@dataclass(frozen=True)
class MistralV11Format(ToolFormat):
    def head_text(self, name: str) -> str:
        return "[TOOL_CALLS]" + name + "[ARGS]"

    def tail_text(self) -> str:
        return ""

    def read_head(self, buf: str) -> tuple[int, str, str] | bool:
        end = buf.find("{")
        if end < 0:
            return MAY_BE_HEAD.fullmatch(buf) is not None
        m = HEAD.fullmatch(buf, 0, end)
        return (end, m.group(1), m.group(2) or "") if m else False

    def prose(self) -> str:
        # not a name followed by "{" or "[" (a call with its markers dropped or spelled out), nor "{" / "["
        return f"[{NAME}]+([^{NAME}{{\\[][\\s\\S]*)?|[^{NAME}{{\\[][\\s\\S]*"

    def hf_messages(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None) -> list[dict[str, Any]]:
        # Small 3.2's template wants 9-character ids (Devstral's and Ministral 3's write none); the
        # system prompt comes first in these templates, so it is not moved as for Nemo
        return with_short_ids(super().hf_messages(messages, tools))


MISTRAL_V11 = MistralV11Format("mistral_v11", sep="", detect=("[ARGS]",), name_first=True,
                               result_open="[TOOL_RESULTS]", result_close="[/TOOL_RESULTS]", id_chars=9,
                               alternate=True)
