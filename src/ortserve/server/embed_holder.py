"""A small lazy holder for embedding models, shared by /v1/embeddings and the vector stores.

Until the multi-model manager (issue 20) adopts it, this is where the server keeps its
embedding models: loaded on first use (the default imported on first use, in a subprocess,
so torch never enters the server), with ``close`` and a memory estimate for a budget.
"""

from __future__ import annotations

import asyncio

from ortserve.engine.embed import Embedder
from ortserve.errors import InvalidRequest, NotFound
from ortserve.models.embed_import import (
    DEFAULT_EMBED_MODEL,
    EMBED_ALIASES,
    choose_embedding,
    embedding_variants,
    ensure_default_embedding,
)
from ortserve.models.store import ModelStore, Variant
from ortserve.server.holder import ModelHolder


class EmbeddingHolder(ModelHolder[Embedder]):
    kind = "embedding"

    def __init__(self, store: ModelStore, default: str = DEFAULT_EMBED_MODEL, threads: int = 0) -> None:
        super().__init__(store, threads)
        self.default = default

    def open(self, v: Variant) -> Embedder:
        return Embedder(v.model_dir, threads=self.threads)

    def resolve(self, ref: str | None) -> Variant:
        """The embedding variant a request names; 404 unknown, 400 a chat model."""
        ref = ref or self.default
        if ref in (DEFAULT_EMBED_MODEL, *EMBED_ALIASES, "default") and self.default == DEFAULT_EMBED_MODEL:
            return ensure_default_embedding(self.store)
        hits = self.store.find(ref)
        if not hits:
            raise NotFound(f"The model '{ref}' does not exist", param="model", code="model_not_found")
        emb = [v for v in hits if v.kind == "embedding"]
        if not emb:
            raise InvalidRequest(f"'{ref}' is a {hits[0].kind} model, not an embedding model; "
                                 f"use e.g. '{DEFAULT_EMBED_MODEL}'", param="model", code="wrong_model_kind")
        return emb[0] if ":" in ref else choose_embedding(emb)

    async def aget(self, ref: str | None = None) -> tuple[Variant, Embedder]:
        return await asyncio.to_thread(self.get, ref)

    def installed(self) -> list[Variant]:
        return embedding_variants(self.store, self.default)
