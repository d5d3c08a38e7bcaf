"""Reranking for the server: which scorer a model name means, and the shared work of
/v1/rerank (server/api/rerank.py), vector-store search (``ranking_options.ranker``) and the
file_search answer path (the ``rag_reranker`` setting).

A store model of kind ``reranker`` is a cross-encoder (rerank/cross_encoder.py), loaded on first
use and kept with the embedding models in the manager's budget and ``ps``; any chat model
(none named: the server's own) judges relevance yes/no through its engine (rerank/judge.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ortserve.errors import ContextLengthExceeded, InvalidRequest, NotFound, OrtServeError
from ortserve.rerank import Ranked, order
from ortserve.rerank.cross_encoder import CrossEncoder
from ortserve.rerank.judge import judge
from ortserve.server.holder import ModelHolder

if TYPE_CHECKING:
    from ortserve.models.store import Variant

MAX_DOCUMENTS = 1000        # Cohere's recommended ceiling per request
RERANK_POOL = 50            # vector-store search: candidates fetched for the reranker to reorder


@dataclass(frozen=True)
class Reranked:
    model: str               # the model that scored (a store id)
    ranked: list[Ranked]     # best first, cut to top_n
    prompt_tokens: int


class RerankerHolder(ModelHolder[CrossEncoder]):
    """Cross-encoder sessions by store variant id, loaded on first use."""

    kind = "reranker"

    def open(self, v: Variant) -> CrossEncoder:
        return CrossEncoder(v.model_dir, threads=self.threads)

    def variant(self, name: str) -> Variant | None:
        """The reranker variant ``name`` means; None when it is no reranker (a chat model, or unknown)."""
        hits = self.store.find(name)
        if hits and all(v.kind == "embedding" for v in hits):
            raise InvalidRequest(f"'{name}' is an embedding model, not a reranker; name a reranker or a chat "
                                 "model", param="model", code="wrong_model_kind")
        ce = [v for v in hits if v.kind == "reranker"]
        return ce[0] if ce else None


def holder_of(state: Any) -> RerankerHolder:
    if state.rerankers is None:
        from ortserve.models.store import ModelStore

        state.rerankers = RerankerHolder(ModelStore(state.settings.store_dir), state.settings.intra_op_threads)
        state.rerankers.manager = state.manager
    return state.rerankers  # type: ignore[no-any-return]


async def rerank(state: Any, model: str | None, query: str, documents: Sequence[str], *,
                 top_n: int | None = None, max_tokens_per_doc: int | None = None) -> Reranked:
    """Score ``documents`` against ``query`` with the named reranker (or chat model) and order them."""
    if not query.strip():
        raise InvalidRequest("'query' must not be empty", param="query")
    if not documents:
        raise InvalidRequest("'documents' must not be empty", param="documents")
    if len(documents) > MAX_DOCUMENTS:
        raise InvalidRequest(f"'documents' has {len(documents)} items; at most {MAX_DOCUMENTS} per request",
                             param="documents")
    holder = holder_of(state)
    v = await asyncio.to_thread(holder.variant, model) if model else None
    if v is not None:
        _, ce = await asyncio.to_thread(holder.hold, v)
        res = await asyncio.to_thread(ce.score, query, list(documents), max_length=None,
                                      max_doc_tokens=max_tokens_per_doc)
        return Reranked(v.id, order(res.scores.tolist(), top_n), res.prompt_tokens)
    engine = await state.engine_for(model)
    docs = [_clip(engine.codec, d, max_tokens_per_doc) for d in documents]
    try:
        judged = await judge(engine, query, docs)
    except ContextLengthExceeded as exc:
        raise ContextLengthExceeded(f"a document does not fit {engine.model_id}'s context with the judge's prompt "
                                    f"({exc.message}); send max_tokens_per_doc to cut long documents",
                                    param="documents") from None
    return Reranked(engine.model_id, order(judged.scores, top_n), judged.prompt_tokens)


def _clip(codec: Any, text: str, limit: int | None) -> str:
    if not limit:
        return text
    ids = codec.encode(text, add_special_tokens=False)
    return text if len(ids) <= limit else str(codec.decode(ids[:limit]))


async def rerank_hits(state: Any, model: str, query: str, hits: list[dict[str, Any]], k: int,
                      threshold: float = 0.0, *, param: str = "model") -> list[dict[str, Any]]:
    """Vector-store hits reordered by the reranker: its score replaces the fused one, then
    ``threshold`` and ``k`` apply. A wrong model name is an error naming ``param``: there a 400
    (a bad value of an options field, as OpenAI answers a wrong ranker), not the 404 of ``model``."""
    try:
        holder_of(state).variant(model) or await state.engine_for(model)
    except OrtServeError as exc:
        if exc.param != "model" or param == "model":
            raise
        if isinstance(exc, NotFound):
            raise InvalidRequest(exc.message, param=param, code=exc.code) from None
        exc.param = param
        raise
    if not hits:
        return []
    res = await rerank(state, model, query, [h["content"][0]["text"] for h in hits])
    out = [{**hits[r.index], "score": r.score} for r in res.ranked if r.score >= threshold]
    return out[:k]
