"""The Responses API's hosted tools (server/hosted_tools.py): which ones a request offers, the
``file_search_call`` output item, and its stream events."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ortserve.errors import InvalidRequest
from ortserve.server.api.responses_input import flat
from ortserve.server.conversation import ChatTurn
from ortserve.server.hosted_tools import OPENAI_OFFLINE, Hosted, file_search_of, run_file_search
from ortserve.server.state import state_of
from ortserve.server.tenancy import own_stores

RESULTS = "file_search_call.results"


def hosted_of(tools: list[dict[str, Any]] | None, tool_choice: Any) -> Hosted:
    """The hosted tools in ``tools``: those left out (each type once, in order) and the file searches."""
    hosted = Hosted()
    for where, t in flat(tools or []):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind in OPENAI_OFFLINE and kind not in hosted.dropped:
            hosted.dropped.append(kind)
        elif kind == "file_search":
            hosted.file_search.append(file_search_of(t, where))
    if isinstance(tool_choice, dict) and tool_choice.get("type") in OPENAI_OFFLINE:
        raise InvalidRequest(f"'tool_choice.type' {tool_choice['type']!r} names a hosted tool that is not available "
                             "offline; it cannot be required", param="tool_choice.type")
    return hosted


def file_search_item(query: str, hits: list[dict[str, Any]], with_results: bool) -> dict[str, Any]:
    """OpenAI's ``file_search_call`` output item; ``results`` only when ``include`` asks for them."""
    results = [{"file_id": h["file_id"], "filename": h["filename"], "score": h["score"],
                "text": h["content"][0]["text"], "attributes": h.get("attributes") or {}} for h in hits]
    return {"type": "file_search_call", "id": f"fs_{uuid.uuid4().hex}", "status": "completed", "queries": [query],
            "results": results if with_results else None}


def file_search_events(item: dict[str, Any], index: int, event: Callable[..., str]) -> list[str]:
    """The events of a search that ran before generation: added, in progress, searching, completed, done."""
    iid = item["id"]
    return [event("response.output_item.added", output_index=index,
                  item={**item, "status": "in_progress", "results": None}),
            event("response.file_search_call.in_progress", output_index=index, item_id=iid),
            event("response.file_search_call.searching", output_index=index, item_id=iid),
            event("response.file_search_call.completed", output_index=index, item_id=iid),
            event("response.output_item.done", output_index=index, item=item)]


async def with_hosted(request: Any, body: Any, turn: ChatTurn) -> tuple[ChatTurn, list[dict[str, Any]], Hosted]:
    """The turn the model gets (with a file search's results in front), the output items made
    before it runs, and the request's hosted tools; the same for /v1/responses and its input_tokens."""
    hosted = hosted_of(body.tools, body.tool_choice)
    if not hosted.file_search or turn.tool_choice == "none":
        return turn, [], hosted
    for fs in hosted.file_search:  # another key's store is a missing one (server/tenancy.py)
        await own_stores(request, fs.vector_store_ids, param=f"{fs.where}.vector_store_ids")
    query, hits, messages = await run_file_search(state_of(request), hosted.file_search, turn.messages)
    return replace(turn, messages=messages), [file_search_item(query, hits, RESULTS in (body.include or []))], hosted
