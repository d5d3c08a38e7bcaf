"""GET /v1/models: the pinned model, every store model (chat, embedding, LoRA adapter), and the router's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from ortserve.server.state import state_of

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """The pinned model first, then every model the store can serve, each saying if it is loaded."""
    st = state_of(request)
    engine = st.ready_engine()
    data = [{"id": engine.model_id, "object": "model", "created": int(st.started), "owned_by": "ortserve",
             "context_length": engine.context_length, "loaded": True, "pinned": True,
             "kind": "vision" if getattr(st.vision, "pinned", None) else "chat"}]   # vision: server/vision_pinned.py
    data += store_models(st, skip={engine.model_id})
    if not any(d["kind"] == "embedding" for d in data):  # the embedded default, imported on first use
        from ortserve.models.embed_import import DEFAULT_EMBED_MODEL, EMBED_ALIASES

        data.append({"id": DEFAULT_EMBED_MODEL, "object": "model", "created": int(st.started), "owned_by": "ortserve",
                     "context_length": None, "loaded": False, "pinned": False, "aliases": EMBED_ALIASES,
                     "kind": "embedding"})
    if st.router is not None and len(st.router.providers) > 1:  # cloud providers configured
        data.append({"id": "auto", "object": "model", "created": int(st.started), "owned_by": "ortserve-router"})
    return {"object": "list", "data": data}


def store_models(st: Any, skip: set[str]) -> list[dict[str, Any]]:
    """Every store variant as an OpenAI model entry, with loaded yes/no from the manager."""
    from ortserve.models.store import ModelStore

    rows = st.manager.ps() if st.manager is not None else []
    loaded = {r["model"]: r for r in rows}
    served_dirs = {Path(r["path"]).resolve() for r in rows if r["pinned"]}
    out = []
    for v in ModelStore(st.settings.store_dir).variants():
        if v.id in skip or Path(v.model_dir).resolve() in served_dirs:
            continue  # the pinned model, listed first under the name it was started with
        if v.kind == "adapter":  # LoRA (server/adapters.py): named by its id, served on its base
            out.append({"id": v.model, "object": "model", "created": int(v.created), "owned_by": "ortserve",
                        "context_length": v.context_length or None, "kind": "adapter", "parent": v.base,
                        "root": v.base, "aliases": [f"{v.base.partition(':')[0]}:{v.model}", *v.aliases],
                        "loaded": any(v.model in r.get("adapters", []) for r in rows), "pinned": False})
            continue
        row = loaded.get(v.id)
        out.append({"id": v.id, "object": "model", "created": int(v.created), "owned_by": "ortserve",
                    "context_length": v.context_length or None, "loaded": bool(row and row["state"] == "loaded"),
                    "pinned": False, "aliases": v.aliases, "kind": getattr(v, "kind", None) or "chat"})
    return out


