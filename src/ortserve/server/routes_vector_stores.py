"""The OpenAI Vector Stores API subset the SDK uses: stores, their files, and search.

Adding a file embeds it before answering (status ``completed`` or ``failed`` at once), so the
SDK's ``upload_and_poll`` and ``create_and_poll`` return after one poll.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ortserve.errors import InvalidRequest
from ortserve.rag.ingest import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP_TOKENS
from ortserve.server.pagination import page
from ortserve.server.routes_files import locked, rag_of
from ortserve.server.routes_seed import state_of

router = APIRouter()


class StaticChunking(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_chunk_size_tokens: int = Field(ge=32, le=4096)
    chunk_overlap_tokens: int = Field(ge=0)


class ChunkingStrategy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "static"]
    static: StaticChunking | None = None

    def sizes(self) -> tuple[int, int]:
        if self.type == "auto":
            return DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP_TOKENS
        if self.static is None:
            raise InvalidRequest("a 'static' chunking strategy needs 'static'", param="chunking_strategy")
        s = self.static
        if s.chunk_overlap_tokens > s.max_chunk_size_tokens // 2:
            raise InvalidRequest("chunk_overlap_tokens may be at most half of max_chunk_size_tokens",
                                 param="chunking_strategy")
        return s.max_chunk_size_tokens, s.chunk_overlap_tokens


class CreateStore(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, max_length=256)
    metadata: dict[str, str] | None = None
    file_ids: list[str] = Field(default_factory=list, max_length=500)
    chunking_strategy: ChunkingStrategy | None = None


class AddFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file_id: str
    attributes: dict[str, str | float | bool] | None = Field(None, max_length=16)
    chunking_strategy: ChunkingStrategy | None = None


class RankingOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ranker: Literal["auto", "default-2024-11-15", "none"] = "auto"
    score_threshold: float = Field(0.0, ge=0.0, le=1.0)


class Search(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str | list[str]
    filters: dict[str, Any] | None = None
    max_num_results: int = Field(10, ge=1, le=50)
    ranking_options: RankingOptions | None = None
    rewrite_query: bool = False
    search_mode: Literal["hybrid", "dense", "bm25"] = "hybrid"   # extension

    def text(self) -> str:
        if self.rewrite_query:
            raise InvalidRequest("rewrite_query is not supported: ortserve searches the query as given",
                                 param="rewrite_query")
        q = self.query if isinstance(self.query, str) else " ".join(self.query)
        if not q.strip():
            raise InvalidRequest("'query' must not be empty", param="query")
        return q


@router.post("/v1/vector_stores")
async def create_store(body: CreateStore, request: Request) -> dict[str, Any]:
    st, rag = state_of(request), rag_of(request)
    for fid in body.file_ids:
        await locked(rag.file, fid)        # 404 before anything is created
    model = (await st.embedder.aget(None))[0].id
    vs = await locked(rag.create_store, body.name, body.metadata, model)
    size, overlap = (body.chunking_strategy or ChunkingStrategy(type="auto")).sizes()
    for fid in body.file_ids:
        await asyncio.to_thread(rag.add_to_store, vs["id"], fid, max_tokens=size, overlap=overlap)
    return await locked(rag.vector_store, vs["id"])  # type: ignore[no-any-return]


@router.get("/v1/vector_stores")
async def list_stores(request: Request) -> dict[str, Any]:
    return page(request, await locked(rag_of(request).vector_stores))


@router.get("/v1/vector_stores/{vs_id}")
async def retrieve_store(vs_id: str, request: Request) -> dict[str, Any]:
    return await locked(rag_of(request).vector_store, vs_id)  # type: ignore[no-any-return]


@router.delete("/v1/vector_stores/{vs_id}")
async def delete_store(vs_id: str, request: Request) -> dict[str, Any]:
    return await locked(rag_of(request).delete_store, vs_id)  # type: ignore[no-any-return]


@router.post("/v1/vector_stores/{vs_id}/files")
async def add_file(vs_id: str, body: AddFile, request: Request) -> dict[str, Any]:
    rag = rag_of(request)
    await locked(rag.vector_store, vs_id)
    await locked(rag.file, body.file_id)
    size, overlap = (body.chunking_strategy or ChunkingStrategy(type="auto")).sizes()
    return await asyncio.to_thread(rag.add_to_store, vs_id, body.file_id,  # type: ignore[no-any-return]
                                   attributes=body.attributes, max_tokens=size, overlap=overlap)


@router.get("/v1/vector_stores/{vs_id}/files")
async def list_store_files(vs_id: str, request: Request, filter: str | None = None) -> dict[str, Any]:
    if filter is not None and filter not in ("in_progress", "completed", "failed", "cancelled"):
        raise InvalidRequest(f"unknown status filter {filter!r}", param="filter")
    return page(request, await locked(rag_of(request).vs_files, vs_id, filter), known=("filter",))


@router.get("/v1/vector_stores/{vs_id}/files/{file_id}")
async def retrieve_store_file(vs_id: str, file_id: str, request: Request) -> dict[str, Any]:
    return await locked(rag_of(request).vs_file, vs_id, file_id)  # type: ignore[no-any-return]


@router.delete("/v1/vector_stores/{vs_id}/files/{file_id}")
async def delete_store_file(vs_id: str, file_id: str, request: Request) -> dict[str, Any]:
    return await locked(rag_of(request).remove_file, vs_id, file_id)  # type: ignore[no-any-return]


@router.post("/v1/vector_stores/{vs_id}/search")
async def search(vs_id: str, body: Search, request: Request) -> dict[str, Any]:
    rag = rag_of(request)
    q = body.text()
    ro = body.ranking_options or RankingOptions()
    # there is no re-ranker to switch off: every ranker value means the fused ranking below
    data = await locked(rag.search, vs_id, q, k=body.max_num_results, filters=body.filters, mode=body.search_mode,
                        score_threshold=ro.score_threshold)
    return {"object": "vector_store.search_results.page", "search_query": q, "data": data,
            "has_more": False, "next_page": None}
