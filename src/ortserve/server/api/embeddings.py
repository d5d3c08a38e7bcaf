"""POST /v1/embeddings in OpenAI's shape: strings or token arrays in, float or base64 out."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ortserve.errors import InvalidRequest
from ortserve.server import published
from ortserve.server.state import ServerState, state_of

router = APIRouter()
MAX_INPUTS = 2048


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: str | list[str] | list[int] | list[list[int]] = Field(json_schema_extra=published.embed_input(MAX_INPUTS))
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    truncate: bool = False      # extension: cut over-long inputs instead of a 400

    @field_validator("input")
    @classmethod
    def _not_empty(cls, v: Any) -> Any:
        items = [v] if isinstance(v, str) else v
        if not items:
            raise ValueError("must not be empty")
        if len(items) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} inputs per request, got {len(items)}")
        for i, x in enumerate(items):
            if isinstance(x, str) and not x.strip() or isinstance(x, list) and not x:
                raise ValueError(f"input {i} is empty")
        return v

    def sequences(self, embedder: Any) -> list[list[int]]:
        """Token ids per input, special tokens included."""
        v = self.input
        if isinstance(v, str):
            return embedder.tokenize([v])
        if all(isinstance(x, str) for x in v):
            return embedder.tokenize(list(v))  # type: ignore[arg-type]
        arrays = [v] if all(isinstance(x, int) for x in v) else v
        vocab = embedder.tokenizer.get_vocab_size()
        for arr in arrays:
            bad = [t for t in arr if not 0 <= t < vocab]  # type: ignore[operator, union-attr]
            if bad:
                raise InvalidRequest(f"token id {bad[0]} is outside this model's vocabulary (0..{vocab - 1})",
                                     param="input")
        return [embedder.wrap(arr) for arr in arrays]  # type: ignore[arg-type]


def encode(vec: np.ndarray, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")
    return vec.tolist()


async def embed_inputs(st: ServerState, model: str | None, sequences: Callable[[Any], list[list[int]]],
                       dimensions: int | None, truncate: bool) -> tuple[Any, Any]:
    """The shared work of every embeddings route: the model (a chat model's name is a 400), the
    dimensions check, ``sequences(embedder)`` fitted to its context, embedded off the event loop."""
    if st.engine is not None and model == st.engine.model_id:
        raise InvalidRequest(f"'{model}' is the chat model this server serves, not an embedding model; "
                             f"use e.g. '{st.embedder.default}'", param="model", code="wrong_model_kind")
    variant, embedder = await st.embedder.aget(model)
    if dimensions is not None and dimensions != embedder.dimensions:
        raise InvalidRequest(f"'dimensions' is {dimensions}; {variant.model} gives {embedder.dimensions} "
                             "only (it is not trained to be shortened)", param="dimensions")
    seqs = embedder.fit(sequences(embedder), truncate)
    return variant, await asyncio.to_thread(embedder.embed_ids, seqs)


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    variant, out = await embed_inputs(state_of(request), body.model, body.sequences, body.dimensions, body.truncate)
    return {"object": "list", "model": variant.id,  # the variant that served it: sent back, it selects the same
            "data": [{"object": "embedding", "index": i, "embedding": encode(v, body.encoding_format)}
                     for i, v in enumerate(out.vectors)],
            "usage": {"prompt_tokens": out.prompt_tokens, "total_tokens": out.prompt_tokens}}
