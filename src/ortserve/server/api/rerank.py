"""Rerank in Cohere's and Jina's shapes: ``POST /v1/rerank``, ``/rerank`` and Cohere's ``/v2/rerank``.

Request: ``model``, ``query``, ``documents`` (strings, or objects with ``text``; Cohere v1's
``rank_fields`` ranks objects on the named fields), ``top_n``, ``return_documents``,
``max_tokens_per_doc``. Response: ``results`` best first, each ``{index, relevance_score,
document?}``, with Cohere's ``meta`` (``billed_units``, ``tokens``) and Jina's ``model`` and
``usage``. ``return_documents`` defaults to true on /v1/rerank and /rerank (Jina, vLLM) and false
on /v2/rerank (Cohere v2 returns none). Errors carry Cohere's top-level ``message`` beside the
OpenAI ``error`` object that names the field (docs/rerank.md).
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ortserve.errors import InvalidRequest, OrtServeError
from ortserve.server import published
from ortserve.server.reranking import MAX_DOCUMENTS, rerank
from ortserve.server.state import state_of

router = APIRouter()
PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=published.RERANK_DOCUMENTS)
    model: str | None = None
    query: str = Field(json_schema_extra=published.text())
    documents: list[str | dict[str, Any]] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool | None = None
    max_tokens_per_doc: int | None = Field(None, ge=1)
    rank_fields: list[str] | None = Field(None, min_length=1)
    priority: int | None = Field(None, ge=0, json_schema_extra={"maximum": 0})  # only 0 (texts() says why)

    def texts(self) -> list[str]:
        """Each document's text: a string as is; an object's ``text``, or its ``rank_fields``
        written as ``field: value`` lines (Cohere v1)."""
        if self.priority:
            raise InvalidRequest("'priority' other than 0 is not supported: requests are served in arrival order",
                                 param="priority")
        out = []
        for i, d in enumerate(self.documents):
            if isinstance(d, str):
                if self.rank_fields is not None:
                    raise InvalidRequest("'rank_fields' needs documents that are objects", param="rank_fields")
                out.append(d)
                continue
            fields = self.rank_fields or ["text"]
            for f in fields:
                if not isinstance(d.get(f), str):
                    raise InvalidRequest(f"document {i} has no string field {f!r}", param=f"documents.{i}.{f}")
            out.append(d["text"] if self.rank_fields is None else "\n".join(f"{f}: {d[f]}" for f in fields))
        return out


def rerank_error(err: OrtServeError) -> dict[str, Any]:
    """Cohere's error shape (``message``) with the OpenAI error object beside it (type, param, code)."""
    return {"message": err.message, **err.to_openai()}


@router.post("/v1/rerank")
@router.post("/rerank")
@router.post("/v2/rerank")
async def rerank_route(body: RerankRequest, request: Request) -> dict[str, Any]:
    texts = body.texts()
    res = await rerank(state_of(request), body.model, body.query, texts, top_n=body.top_n,
                       max_tokens_per_doc=body.max_tokens_per_doc)
    keep = body.return_documents if body.return_documents is not None else request.url.path != "/v2/rerank"
    results = []
    for r in res.ranked:
        item: dict[str, Any] = {"index": r.index, "relevance_score": r.score}
        if keep:
            d = body.documents[r.index]
            item["document"] = {"text": d} if isinstance(d, str) else d
        results.append(item)
    version = "2" if request.url.path == "/v2/rerank" else "1"
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": res.model, "results": results,
            "meta": {"api_version": {"version": version}, "billed_units": {"search_units": 1},
                     "tokens": {"input_tokens": res.prompt_tokens, "output_tokens": 0}},
            "usage": {"prompt_tokens": res.prompt_tokens, "total_tokens": res.prompt_tokens}}
