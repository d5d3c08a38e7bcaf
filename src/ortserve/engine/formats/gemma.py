"""Gemma 2 / 3: no tool syntax in the template or the vocabulary. The choice here follows Google's
function-calling guide for Gemma (a fenced ``tool_code`` block per call, results in a fenced
``tool_output`` block) with a JSON call inside the fence, so the arguments stay schema-enforced:

    ```tool_code
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    ```

Gemma's template refuses a system turn and wants user/model turns strictly alternating: the
system prompt (with the tools) goes into the first user turn, and tool results join the user turn."""

from __future__ import annotations

from ortserve.engine.formats.base import ToolFormat

GEMMA = ToolFormat("gemma", open="```tool_code\n", close="\n```", sep="\n", detect=("<start_of_turn>",),
                   result_open="```tool_output\n", result_close="\n```", system_role=False, alternate=True)
