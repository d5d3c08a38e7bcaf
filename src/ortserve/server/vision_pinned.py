"""A vision model as the server's pinned start model (``ortserve serve --model <a vision model>``).

The start model is a vision model when its directory has the import's ``vision.json``. It loads
once, as a VisionEngine (server/vision_engine.py) over its batched engine, and no text engine is
loaded: the batched engine (an ``AsyncEngine``) becomes the server's pinned default engine
(``ServerState.engine``: /healthz, /v1/models, /api/tags, /metrics, the drain), adopted by the model
manager as the pinned chat slot, so it is never evicted nor unloaded by keep_alive; and the
VisionHolder (server/vision.py) holds it pinned, so a chat turn with no model, a generic name, the
served id or the model's store name runs on the vision path, images or not; the routes with no
images (/v1/completions, /tokenize, /api/generate without images) run on the same batched engine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ortserve.engine import AsyncEngine
from ortserve.models.store import Variant
from ortserve.server.vision_engine import VisionEngine
from ortserve.vision.runner import SIDE_FILE


def is_vision_dir(model_dir: Path | str | None) -> bool:
    return model_dir is not None and (Path(model_dir) / SIDE_FILE).is_file()


def variant_of(store: Any, model_dir: Path, model_id: str) -> Variant:
    """The store variant installed at ``model_dir``, or one that names a directory outside the store."""
    want = Path(model_dir).resolve()
    found = next((v for v in store.variants() if Path(v.model_dir).resolve() == want), None)
    if found is not None:
        return found
    model, _, variant = model_id.partition(":")
    return Variant(model=model, variant=variant or "dir", precision="", device="cpu", path=want, kind="vision")


async def start_pinned_vision(state: Any, model_dir: Path, model_id: str) -> AsyncEngine:
    """Load the vision start model (in a prep thread), start its engine under the manager as the
    pinned default, and pin it in the vision holder; returns the engine the server serves by default."""
    holder = state.vision
    if holder.settings is None:
        holder.settings = state.settings
    v = variant_of(holder.store, Path(model_dir), model_id)
    loop = asyncio.get_running_loop()
    vision = await loop.run_in_executor(holder.prep, VisionEngine, model_id, Path(model_dir), holder.settings,
                                        holder.prep)
    vision.started, vision.loop = True, loop   # the manager starts the engine below, on this loop
    slot = await state.manager.adopt(vision.engine, model_dir, model_id)
    slot.planned_bytes = vision.memory_bytes() + int(getattr(vision.engine, "kv_budget", 0) or 0)
    holder.pin(v, vision, model_id)
    for name in (v.id, v.model, *v.aliases):   # its store names mean the pinned engine on the text routes too
        state.manager.aliases.setdefault(name, model_id)
    return vision.engine
