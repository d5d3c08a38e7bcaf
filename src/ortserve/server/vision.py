"""Image requests on the chat APIs: which model reads images, the images of a turn, and the runs.

Each wire adapter turns its image parts (OpenAI ``image_url``, Responses ``input_image``,
Anthropic ``image`` blocks) into one internal part, ``image_part(url, param)``, inside a message's
list content. ``Conversation.start`` asks :func:`route` first: a turn with images, or any turn for
a store model of kind ``vision``, runs here; images for a text-only model are a 400 naming the
first image's field. The images are checked (bytes, count, pixels; vision/images.py) before
anything runs.

Each vision model runs on a batched engine of its own (server/vision_engine.py): image and text
requests for it are rows of the same continuous batch, and their events come back through the
engine's own RequestHandle, so every adapter renders them as it renders text answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from ortserve.engine import RequestHandle
from ortserve.errors import InvalidRequest
from ortserve.models.sampling import defaults_for
from ortserve.models.store import ModelStore, Variant
from ortserve.providers.structured import ToolPlan, constrain
from ortserve.server.holder import ModelHolder
from ortserve.server.model_names import GENERIC_NAMES
from ortserve.server.vision_engine import VisionEngine
from ortserve.vision.images import ImageInput, ImageLimits, check_count, from_url
from ortserve.vision.runner import MARKER


def image_part(url: str, param: str) -> dict[str, Any]:
    """The internal form of one image in a message's content: a data URL and the field it came in."""
    return {"type": "image_url", "url": url, "param": param}


def image_params(messages: list[dict[str, Any]]) -> list[str]:
    return [p["param"] for m in messages if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"]


def flatten(messages: list[dict[str, Any]], limits: ImageLimits) -> tuple[list[dict[str, Any]], list[ImageInput]]:
    """Messages with string content (each image as the model's image marker) and the images, checked."""
    out, images = [], []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            text = []
            for p in content:
                if p.get("type") == "image_url":
                    images.append(from_url(p["url"], p["param"], limits))
                    text.append(MARKER)
                else:
                    text.append(p.get("text", ""))
            m = {**m, "content": "".join(text)}
        out.append(m)
    check_count(images, limits)
    return out, images


class VisionHolder(ModelHolder[VisionEngine]):
    """The vision models of the store, loaded on first use (server/holder.py: the manager's budget,
    keep_alive and ps), each a batched engine of its own (server/vision_engine.py)."""

    kind = "vision"

    def __init__(self, store: ModelStore, limits: ImageLimits, settings: Any = None) -> None:
        super().__init__(store)
        self.limits = limits
        self.settings = settings   # the server's (max_batch, kv_cache_mb, prefill_chunk, prefix_cache)
        # loading, decoding, patches and the encoder run here, off the event loop
        self.prep = ThreadPoolExecutor(2, thread_name_prefix="vision-prep")
        # the server's start model when it is a vision model (server/vision_pinned.py): never dropped
        self.pinned: tuple[Variant, VisionEngine] | None = None
        self.pinned_names: set[str] = set()

    def pin(self, v: Variant, engine: VisionEngine, served_id: str) -> None:
        """Hold ``engine`` as the pinned start model: no model, a generic name, the id it was started
        with or its store names mean it (the manager holds its slot, pinned)."""
        self.pinned = (v, engine)
        self.pinned_names = {served_id, v.id, v.model, *v.aliases}

    def variant(self, name: str | None) -> Variant | None:
        if self.pinned is not None and (not name or name.lower() in GENERIC_NAMES or name in self.pinned_names):
            return self.pinned[0]
        if not name:
            return None
        return next((v for v in self.store.find(name) if v.kind == "vision"), None)

    def _hold(self, v: Variant) -> tuple[Variant, VisionEngine]:
        if self.pinned is not None and v.id == self.pinned[0].id:
            if self.manager is not None:
                self.manager.touch(self.pinned[1].model_id)   # the pinned slot's id: requests, last use
            return self.pinned
        return super()._hold(v)

    def resolve(self, ref: str | None) -> Variant:
        v = self.variant(ref)
        if v is None:
            raise InvalidRequest(f"no vision model named {ref!r}", param="model", code="model_not_found")
        return v

    def open(self, v: Variant) -> VisionEngine:
        return VisionEngine(v.model, v.model_dir, self.settings, self.prep)

    def engine(self, name: str) -> VisionEngine:
        """The loaded engine of a vision model by name (tests: its counters)."""
        return self.get(name)[1]

    def close(self, ref: str | None = None) -> None:
        """Drop models (the manager's keep_alive or eviction) and stop their engine loops; a request
        in flight ends with the loop."""
        with self._lock:
            gone = [m for k, (_, m) in self._loaded.items() if ref is None or k == ref or k.split(":")[0] == ref]
        super().close(ref)
        for m in gone:
            m.close()


def route(st: Any, turn: Any) -> tuple[VisionHolder, Variant, list[dict[str, Any]], list[ImageInput]] | None:
    """The holder, vision model, flattened messages and images of a turn that runs here, or None."""
    holder: VisionHolder | None = getattr(st, "vision", None)
    params = image_params(turn.messages)
    v = holder.variant(turn.model) if holder is not None else None
    if holder is None or v is None:
        if params:
            raise InvalidRequest(f"'{params[0]}' is an image, and the model '{turn.model or st.served_id}' reads "
                                 "text only; send images to a vision model (docs/vision.md)", param=params[0],
                                 code="model_not_vision")
        return None
    messages, images = flatten(turn.messages, holder.limits)
    return holder, v, messages, images


async def start_vision(st: Any, turn: Any, sampling: Any, span: Any, plan_of: Callable[[Any, Any], Any]
                       ) -> tuple[VisionEngine, list[RequestHandle], dict[str, str], ToolPlan | None] | None:
    """Run a turn with images (or for a vision model) here: its engine, the n choices' handles, the
    sampling headers and the tool plan; None where the turn is for a text engine. ``plan_of`` is the
    text path's planner (conversation.py prompt_plan: tools in the model's call syntax, the output
    constraint, the thinking switch); tools and response_format become the same grammar
    (providers/structured.py constrain), logprobs and n as for a text engine."""
    routed = route(st, turn)
    if routed is None:
        return None
    holder, v, messages, images = routed
    if holder.settings is None:
        holder.settings = st.settings
    _, engine = await asyncio.get_running_loop().run_in_executor(holder.prep, holder.hold, v)   # loads on first use
    span.set(model=engine.model_id, provider="local", execution_provider="cpu")
    defaults = defaults_for(st.settings, engine.dir)
    max_tokens = turn.max_tokens
    if turn.max_tokens_is_ceiling and max_tokens is not None:
        max_tokens = min(max_tokens, st.settings.max_tokens_cap)
    params = sampling.to_sampling_params(st.settings.default_max_tokens, st.settings.max_tokens_cap, max_tokens,
                                         defaults)
    if turn.max_tokens_is_ceiling:   # Anthropic's max_tokens: cut to the room left, as on a text engine
        params = replace(params, fit_context=True)
    headers = sampling.sampling_headers(params, defaults)
    plan, output, thinking, _ = plan_of(engine.engine, turn)
    params = replace(constrain(engine.engine, params, output, plan, thinking), logprobs=turn.logprobs)
    handles = await engine.submit_n(messages, images, params, holder.limits, turn.n,
                                    plan.prompt_tools() if plan else None, thinking)
    return engine, handles, headers, plan
