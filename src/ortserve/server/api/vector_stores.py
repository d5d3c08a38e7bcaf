"""The OpenAI Vector Stores API subset the SDK uses: stores, their files, file batches, search.

Adding a file (alone, in a batch, or with a new store) answers at once with the file
``in_progress``; the server's worker (rag/jobs.py) embeds it in the background and marks it
``completed`` or ``failed`` with ``last_error``. The SDK's ``create_and_poll`` /
``upload_and_poll`` poll until then; an ``openai-poll-after-ms`` header paces them.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ortserve.errors import InvalidRequest
from ortserve.rag.ingest import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP_TOKENS
from ortserve.server import published
from ortserve.server.pagination import page
from ortserve.server.rag_access import locked, rag_of
from ortserve.server.reranking import RERANK_POOL, rerank_hits
from ortserve.server.state import state_of
from ortserve.server.tenancy import claimed, mine, own_files, own_store_path

router = APIRouter(dependencies=[Depends(own_store_path)])   # another key's store: the 404 of a missing one
POLL_AFTER_MS = 200
STATUSES = ("in_progress", "completed", "failed", "cancelled")
# published as the enum it is checked against (the routes' own check keeps its message)
STATUS_FILTER: Any = Query(None, json_schema_extra={"enum": list(STATUSES)})
FUSED_RANKERS = ("auto", "default-2024-11-15", "none")


class StaticChunking(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_chunk_size_tokens: int = Field(ge=32, le=4096)
    chunk_overlap_tokens: int = Field(ge=0)


class ChunkingStrategy(BaseModel):
    # published: 'static' needs its sizes (sizes() refuses it without)
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"properties": {"type": {"const": "auto"}}},
        {"required": ["static"], "properties": {"type": {"const": "static"}, "static": {"type": "object"}}}]})
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


class BatchFile(AddFile):
    pass


class CreateBatch(BaseModel):
    # published: exactly one of file_ids and files; with files, no batch-level settings (jobs())
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": ["file_ids"], "properties": {"file_ids": {"type": "array"}, "files": {"type": "null"}}},
        {"required": ["files"], "properties": {"files": {"type": "array"}, "file_ids": {"type": "null"},
                                               "attributes": {"type": "null"},
                                               "chunking_strategy": {"type": "null"}}}]})
    file_ids: list[str] | None = Field(None, min_length=1, max_length=2000)
    files: list[BatchFile] | None = Field(None, min_length=1, max_length=2000)
    attributes: dict[str, str | float | bool] | None = Field(None, max_length=16)
    chunking_strategy: ChunkingStrategy | None = None

    def jobs(self) -> list[tuple[str, dict[str, Any] | None, int, int]]:
        """(file id, attributes, chunk size, overlap) per file, in the order given."""
        if (self.file_ids is None) == (self.files is None):
            raise InvalidRequest("give exactly one of 'file_ids' and 'files'", param="file_ids")
        if self.file_ids is not None:
            size, overlap = (self.chunking_strategy or ChunkingStrategy(type="auto")).sizes()
            return [(fid, self.attributes, size, overlap) for fid in self.file_ids]
        for name in ("attributes", "chunking_strategy"):   # OpenAI ignores them here; we refuse, not ignore
            if getattr(self, name) is not None:
                raise InvalidRequest(f"with 'files', give '{name}' in each file, not for the batch", param=name)
        out = []
        for f in self.files or []:
            size, overlap = (f.chunking_strategy or ChunkingStrategy(type="auto")).sizes()
            out.append((f.file_id, f.attributes, size, overlap))
        return out


class RankingOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # OpenAI's values keep the fused ranking; any other value names a reranker (a cross-encoder
    # from the store, or a chat model as a yes/no judge: docs/rerank.md) that reorders the hits
    ranker: str = Field("auto", min_length=1)
    score_threshold: float = Field(0.0, ge=0.0, le=1.0)

    @property
    def reranker(self) -> str | None:
        return None if self.ranker in FUSED_RANKERS else self.ranker


class Search(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # a blank query (a list: blank once joined) is a 400 in text(); so is rewrite_query true
    query: str | list[str] = Field(json_schema_extra={"anyOf": [
        published.text(), {"type": "array", "items": {"type": "string"}, "contains": published.text()}]})
    filters: dict[str, Any] | None = None
    max_num_results: int = Field(10, ge=1, le=50)
    ranking_options: RankingOptions | None = None
    rewrite_query: bool = Field(False, json_schema_extra={"const": False})
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
    await own_files(request, body.file_ids)
    for fid in body.file_ids:
        await locked(rag.file, fid)        # 404 before anything is created
    size, overlap = (body.chunking_strategy or ChunkingStrategy(type="auto")).sizes()
    if body.file_ids:
        await asyncio.to_thread(rag.check_chunking, size)
        rag.worker.room(len(body.file_ids))
    model = (await st.embedder.aget(None))[0].id
    vs = await claimed(request, "vector_stores", await locked(rag.create_store, body.name, body.metadata, model))
    for fid in body.file_ids:
        await locked(rag.enqueue_file, vs["id"], fid, attributes=None, max_tokens=size, overlap=overlap)
    rag.worker.submit([(vs["id"], fid) for fid in body.file_ids])
    return await locked(rag.vector_store, vs["id"])  # type: ignore[no-any-return]


@router.get("/v1/vector_stores")
async def list_stores(request: Request) -> dict[str, Any]:
    return page(request, await mine(request, "vector_stores", await locked(rag_of(request).vector_stores)))


@router.get("/v1/vector_stores/{vs_id}")
async def retrieve_store(vs_id: str, request: Request, response: Response) -> dict[str, Any]:
    return _paced(response, await locked(rag_of(request).vector_store, vs_id))


@router.delete("/v1/vector_stores/{vs_id}")
async def delete_store(vs_id: str, request: Request) -> dict[str, Any]:
    return await locked(rag_of(request).delete_store, vs_id)  # type: ignore[no-any-return]


@router.post("/v1/vector_stores/{vs_id}/files")
async def add_file(vs_id: str, body: AddFile, request: Request, response: Response) -> dict[str, Any]:
    rag = rag_of(request)
    await locked(rag.vector_store, vs_id)
    await own_files(request, [body.file_id])
    await locked(rag.file, body.file_id)
    size, overlap = (body.chunking_strategy or ChunkingStrategy(type="auto")).sizes()
    await asyncio.to_thread(rag.check_chunking, size)
    rag.worker.room(1)
    f = await locked(rag.enqueue_file, vs_id, body.file_id, attributes=body.attributes, max_tokens=size,
                     overlap=overlap)
    rag.worker.submit([(vs_id, body.file_id)])
    return _paced(response, f)


def _paced(response: Response, obj: dict[str, Any]) -> dict[str, Any]:
    """Tell the SDK's pollers how soon to look again (its default is a whole second)."""
    busy = obj.get("status") == "in_progress" or obj.get("file_counts", {}).get("in_progress")
    if busy:
        response.headers["openai-poll-after-ms"] = str(POLL_AFTER_MS)
    return obj


@router.get("/v1/vector_stores/{vs_id}/files")
async def list_store_files(vs_id: str, request: Request, filter: str | None = STATUS_FILTER) -> dict[str, Any]:
    if filter is not None and filter not in STATUSES:
        raise InvalidRequest(f"unknown status filter {filter!r}", param="filter")
    return page(request, await locked(rag_of(request).vs_files, vs_id, filter), known=("filter",))


@router.get("/v1/vector_stores/{vs_id}/files/{file_id}")
async def retrieve_store_file(vs_id: str, file_id: str, request: Request, response: Response) -> dict[str, Any]:
    return _paced(response, await locked(rag_of(request).vs_file, vs_id, file_id))


@router.delete("/v1/vector_stores/{vs_id}/files/{file_id}")
async def delete_store_file(vs_id: str, file_id: str, request: Request) -> dict[str, Any]:
    return await locked(rag_of(request).remove_file, vs_id, file_id)  # type: ignore[no-any-return]


@router.post("/v1/vector_stores/{vs_id}/file_batches")
async def create_batch(vs_id: str, body: CreateBatch, request: Request, response: Response) -> dict[str, Any]:
    rag = rag_of(request)
    jobs = body.jobs()
    await own_files(request, [fid for fid, *_ in jobs], "file_ids")
    await locked(rag.vector_store, vs_id)
    await asyncio.to_thread(rag.check_chunking, max(size for _, _, size, _ in jobs))
    rag.worker.room(len(jobs))
    batch = await locked(rag.create_batch, vs_id, jobs)
    rag.worker.submit([(vs_id, fid) for fid, *_ in jobs])
    return _paced(response, batch)


@router.get("/v1/vector_stores/{vs_id}/file_batches/{batch_id}")
async def retrieve_batch(vs_id: str, batch_id: str, request: Request, response: Response) -> dict[str, Any]:
    return _paced(response, await locked(rag_of(request).batch, vs_id, batch_id))


@router.post("/v1/vector_stores/{vs_id}/file_batches/{batch_id}/cancel")
async def cancel_batch(vs_id: str, batch_id: str, request: Request) -> dict[str, Any]:
    body = await request.body()  # read (up to the limit) even though it takes none: an oversized one is a 413
    if body.strip() not in (b"", b"{}", b"null"):
        raise InvalidRequest("cancelling a file batch takes no request body", param="body")
    return await locked(rag_of(request).cancel_batch, vs_id, batch_id)  # type: ignore[no-any-return]


@router.get("/v1/vector_stores/{vs_id}/file_batches/{batch_id}/files")
async def list_batch_files(vs_id: str, batch_id: str, request: Request,
                           filter: str | None = STATUS_FILTER) -> dict[str, Any]:
    if filter is not None and filter not in STATUSES:
        raise InvalidRequest(f"unknown status filter {filter!r}", param="filter")
    return page(request, await locked(rag_of(request).batch_files, vs_id, batch_id, filter), known=("filter",))


@router.post("/v1/vector_stores/{vs_id}/search")
async def search(vs_id: str, body: Search, request: Request) -> dict[str, Any]:
    rag = rag_of(request)
    q = body.text()
    ro = body.ranking_options or RankingOptions()
    if ro.reranker is None:   # OpenAI's rankers: the fused (hybrid) ranking as it is
        data = await locked(rag.search, vs_id, q, k=body.max_num_results, filters=body.filters,
                            mode=body.search_mode, score_threshold=ro.score_threshold)
    else:                     # a reranker reorders a larger pool; the threshold applies to its scores
        pool = await locked(rag.search, vs_id, q, k=max(body.max_num_results, RERANK_POOL), filters=body.filters,
                            mode=body.search_mode)
        data = await rerank_hits(state_of(request), ro.reranker, q, pool, body.max_num_results,
                                 ro.score_threshold, param="ranking_options.ranker")
    return {"object": "vector_store.search_results.page", "search_query": q, "data": data,
            "has_more": False, "next_page": None}
