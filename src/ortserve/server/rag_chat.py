"""Chat answers from vector stores: the ``file_search`` extension of /v1/chat/completions.

``{"file_search": {"vector_store_ids": ["vs_..."], "max_num_results": 4}}`` (the shape of the
Responses API's file_search tool, as a top-level field because Chat Completions has no such
tool): the last user message is searched in the stores, the best chunks go in front of the
conversation as numbered sources, and the response carries ``citations``. Such a request is
private: its context never leaves the machine unless ORTSERVE_RAG_ALLOW_CLOUD is set.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ortserve.errors import InvalidRequest
from ortserve.rag.answer import citations, last_user_text, with_context
from ortserve.server.protocol import Message
from ortserve.server.rag_access import locked, rag_of
from ortserve.server.reranking import RERANK_POOL, rerank_hits
from ortserve.server.tenancy import own_stores


async def apply_file_search(body: Any, request: Request) -> list[dict[str, Any]]:
    """Search, put the sources in ``body.messages``, mark the request private; the citations."""
    fs = body.file_search
    st = request.app.state.ortserve
    messages = body.plain_messages()
    query = last_user_text(messages)
    if not query:
        raise InvalidRequest("file_search needs a user message to search for", param="messages")
    rag = rag_of(request)
    hits: list[dict[str, Any]] = []
    await own_stores(request, fs.vector_store_ids, "vector_store_id")   # another key's: a missing store
    for vid in fs.vector_store_ids:
        await locked(rag.vector_store, vid)   # 404 naming the id before any work
    reranker = st.settings.rag_reranker       # a larger pool per store, reordered by the reranker
    k = max(fs.max_num_results, RERANK_POOL // len(fs.vector_store_ids)) if reranker else fs.max_num_results
    for vid in fs.vector_store_ids:
        hits += await locked(rag.search, vid, query, k=k, filters=fs.filters, mode=fs.search_mode)
    if reranker:
        hits = await rerank_hits(st, reranker, query, hits, fs.max_num_results, param="file_search")
    else:
        hits = sorted(hits, key=lambda h: -h["score"])[:fs.max_num_results]
    body.messages = [Message(**m) for m in with_context(messages, hits)]
    if not st.settings.rag_allow_cloud:
        body.metadata = {**(body.metadata or {}), "privacy": "high"}
    return citations(hits)


def add_to_response(resp: Any, cites: list[dict[str, Any]]) -> Any:
    """The citations in a chat response: a dict, a JSONResponse, or an SSE stream's first event."""
    if isinstance(resp, dict):
        return {**resp, "citations": cites}
    if isinstance(resp, JSONResponse):
        data = json.loads(bytes(resp.body))
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length", "content-type")}
        return JSONResponse({**data, "citations": cites}, status_code=resp.status_code, headers=headers)
    if hasattr(resp, "body_iterator"):
        resp.body_iterator = _first_event_with(resp.body_iterator, cites)
    return resp


async def _first_event_with(events: AsyncIterator[Any], cites: list[dict[str, Any]]) -> AsyncIterator[Any]:
    first = True
    async for ev in events:
        text = ev.decode() if isinstance(ev, bytes) else ev
        if first and text.startswith("data: {"):
            first = False
            data = json.loads(text[6:].strip())
            text = f"data: {json.dumps({**data, 'citations': cites})}\n\n"
        yield text
