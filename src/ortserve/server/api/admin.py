"""Admin endpoints of the model manager: what is loaded (ps), load, unload.

They sit behind the same API key as every route but /healthz (GuardMiddleware), and
`ortserve ps/load/unload` are their clients.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ortserve.errors import InvalidRequest, Unavailable
from ortserve.server.manager import ModelManager, parse_keep_alive
from ortserve.server.published import KEEP_ALIVE
from ortserve.server.state import state_of

router = APIRouter()


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    keep_alive: float | str | None = Field(None, json_schema_extra=KEEP_ALIVE)

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, v: Any) -> Any:
        return parse_keep_alive(v)


class UnloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)


def _manager(request: Request) -> ModelManager:
    st = state_of(request)
    st.ready_engine()
    if st.manager is None:  # pragma: no cover - create_app always makes one
        raise Unavailable("this server has no model manager")
    return st.manager


@router.get("/v1/admin/ps")
async def ps(request: Request) -> dict[str, Any]:
    return _manager(request).summary()


@router.post("/v1/admin/load")
async def load(body: LoadRequest, request: Request) -> dict[str, Any]:
    manager = _manager(request)
    st = state_of(request)
    t0 = time.monotonic()
    try:
        await manager.get(body.model, keep_alive=body.keep_alive)
        sid = manager.id_for(body.model)
    except InvalidRequest as exc:
        if exc.code != "wrong_model_kind" or st.embedder is None:
            raise
        variant, _ = await st.embedder.aget(body.model)  # an embedding model: its holder loads it
        sid = variant.id
    row = next(r for r in manager.ps() if r["model"] == sid)
    return {"loaded": sid, "seconds": round(time.monotonic() - t0, 3), "model": row}


@router.post("/v1/admin/unload")
async def unload(body: UnloadRequest, request: Request) -> dict[str, Any]:
    slot = await _manager(request).unload(body.model)
    return {"unloaded": slot.id, "requests": slot.requests}
