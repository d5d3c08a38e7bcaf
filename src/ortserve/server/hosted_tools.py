"""Hosted tools that clients offer: the ones ortserve cannot run offline are not offered to the model,
and the answer says so; ``file_search`` runs on the local vector stores.

Codex CLI offers ``web_search`` in every Responses request and the Agents SDK's ``WebSearchTool()``
does the same; Claude clients may offer Anthropic's server tools (``web_search_20250305``...). Such a
tool needs a service ortserve does not have, so the request goes on without it: the response carries
the header ``x-ortserve-warning`` naming the tools left out (and Responses objects an
``ortserve_warnings`` list), and the server logs it. ``file_search`` is different: its vector stores
are the server's own, so the last user message is searched there and the results go to the model
(docs/agents.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ortserve.errors import InvalidRequest
from ortserve.rag.answer import last_user_text, with_context
from ortserve.server.rag_access import locked, open_rag
from ortserve.server.reranking import RERANK_POOL, rerank_hits

log = logging.getLogger("ortserve.server")

WARNING_HEADER = "x-ortserve-warning"
# OpenAI's hosted tools that need a service (the web, a sandbox, an image model, a remote MCP server)
OPENAI_OFFLINE = frozenset({"web_search", "web_search_preview", "web_search_preview_2025_03_11",
                            "web_search_2025_08_26", "image_generation", "code_interpreter", "computer_use_preview",
                            "computer_use", "computer", "mcp"})
# Anthropic's server tools (run by Anthropic, versioned by date): web search and fetch, code execution
ANTHROPIC_SERVER = ("web_search_", "web_fetch_", "code_execution_")
FILE_SEARCH_KEYS = {"type", "vector_store_ids", "max_num_results", "filters", "ranking_options"}
RANKERS = {"auto", "default-2024-11-15", "none"}


@dataclass
class FileSearch:
    vector_store_ids: list[str]
    max_num_results: int = 10
    filters: dict[str, Any] | None = None
    score_threshold: float = 0.0
    where: str = "tools.0"  # the tool's place in the request, for a 400 or 404 naming it
    reranker: str | None = None  # ranking_options.ranker naming a reranker or chat model (docs/rerank.md)


@dataclass
class Hosted:
    """A request's hosted tools: the types left out, and the file searches to run."""

    dropped: list[str] = field(default_factory=list)
    file_search: list[FileSearch] = field(default_factory=list)

    def headers(self) -> dict[str, str]:
        return {WARNING_HEADER: warning_text(self.dropped)} if self.dropped else {}

    def warnings(self) -> list[str]:
        return [warning_text(self.dropped)] if self.dropped else []


def warning_text(dropped: list[str]) -> str:
    return f"hosted tools not available offline were not offered to the model: {', '.join(dropped)}"


def note_dropped(dropped: list[str], route: str) -> None:
    if dropped:
        log.warning("%s: %s", route, warning_text(dropped))


def is_anthropic_server_tool(tool: Any) -> bool:
    return isinstance(tool, dict) and "input_schema" not in tool and str(tool.get("type", "")).startswith(
        ANTHROPIC_SERVER)


def file_search_of(tool: dict[str, Any], where: str) -> FileSearch:
    """An OpenAI ``file_search`` tool, checked: a 400 names the field that is wrong or unknown."""
    for key in tool:
        if key not in FILE_SEARCH_KEYS:
            raise InvalidRequest(f"'{where}.{key}' is not supported on file_search", param=f"{where}.{key}")
    ids = tool.get("vector_store_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise InvalidRequest(f"'{where}.vector_store_ids' must be a non-empty list of vector store ids",
                             param=f"{where}.vector_store_ids")
    k = tool.get("max_num_results", 10)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 50:
        raise InvalidRequest(f"'{where}.max_num_results' must be an integer from 1 to 50",
                             param=f"{where}.max_num_results")
    filters = tool.get("filters")
    if filters is not None and not isinstance(filters, dict):
        raise InvalidRequest(f"'{where}.filters' must be an object", param=f"{where}.filters")
    ranking = tool.get("ranking_options") or {}
    for key, value in ranking.items() if isinstance(ranking, dict) else [("", None)]:
        ok = (key == "ranker" and isinstance(value, str) and value.strip() != "") or (
            key == "score_threshold" and isinstance(value, int | float) and 0 <= value <= 1)
        if not ok:
            raise InvalidRequest(f"'{where}.ranking_options.{key}' is not supported (ranker "
                                 f"{'/'.join(sorted(RANKERS))} or a reranker model, score_threshold 0..1)",
                                 param=f"{where}.ranking_options" + (f".{key}" if key else ""))
    threshold = float(ranking.get("score_threshold", 0.0)) if isinstance(ranking, dict) else 0.0
    ranker = ranking.get("ranker") if isinstance(ranking, dict) else None
    return FileSearch(ids, k, filters, threshold, where, None if ranker in RANKERS or ranker is None else ranker)


async def run_file_search(st: Any, searches: list[FileSearch], messages: list[dict[str, Any]],
                          param: str = "input") -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """Search the stores for the last user message: (query, hits best first, the messages with the
    hits in front as numbered sources, as chat's file_search extension gives them, rag/answer.py)."""
    query = last_user_text(messages)
    if not query:
        raise InvalidRequest("file_search needs a user message to search for", param=param)
    rag = open_rag(st)
    hits: list[dict[str, Any]] = []
    k = max(fs.max_num_results for fs in searches)
    for fs in searches:
        for vid in fs.vector_store_ids:
            await locked(rag.vector_store, vid)  # a 404 naming the store before any search
        reranker = fs.reranker or st.settings.rag_reranker   # the tool's ranker, else the server's
        for vid in fs.vector_store_ids:
            found = await locked(rag.search, vid, query, k=RERANK_POOL if reranker else fs.max_num_results,
                                 filters=fs.filters, score_threshold=0.0 if reranker else fs.score_threshold)
            hits += await rerank_hits(st, reranker, query, found, fs.max_num_results, fs.score_threshold,
                                      param=f"{fs.where}.ranking_options.ranker") if reranker else found
    hits = sorted(hits, key=lambda h: -h["score"])[:k]
    return query, hits, with_context(messages, hits) if hits else messages
