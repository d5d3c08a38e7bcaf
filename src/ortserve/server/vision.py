"""Image requests on the chat APIs: which model reads images, the images of a turn, and the runs.

Each wire adapter turns its image parts (OpenAI ``image_url``, Responses ``input_image``,
Anthropic ``image`` blocks) into one internal part, ``image_part(url, param)``, inside a message's
list content. ``Conversation.start`` asks :func:`route` first: a turn with images, or any turn for
a store model of kind ``vision``, runs here; images for a text-only model are a 400 naming the
first image's field. The images are checked (bytes, count, pixels; vision/images.py) before
anything runs.

First step of issue 42: og's own multimodal generator, one image request at a time (the model's
lock), in a worker thread beside the batched text engine. Each run yields TokenEvents into a
handle shaped like the engine's, so every adapter renders it as it renders text answers.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ortserve.engine.tokenizer import TextCodec
from ortserve.errors import InvalidRequest
from ortserve.models.sampling import defaults_for
from ortserve.models.store import ModelStore, Variant
from ortserve.types import Metrics, SamplingParams, TokenEvent
from ortserve.vision.images import ImageInput, ImageLimits, check_count, decode, from_url
from ortserve.vision.runner import MARKER, Sampling, VisionModel


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


class VisionHolder:
    """The vision models of the store, loaded on first use, each run in one worker thread."""

    def __init__(self, store: ModelStore, limits: ImageLimits) -> None:
        self.store = store
        self.limits = limits
        self._loaded: dict[str, VisionEngine] = {}
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="vision")   # og's generator: one run at a time
        # loading, decoding, patches and the encoder run here, off the event loop (and beside a run)
        self.prep = ThreadPoolExecutor(2, thread_name_prefix="vision-prep")
        self.manager: Any = None   # server/manager.ModelManager: budget, keep_alive, ps (as Whisper's)

    def variant(self, name: str | None) -> Variant | None:
        if not name:
            return None
        return next((v for v in self.store.find(name) if v.kind == "vision"), None)

    def get(self, v: Variant) -> VisionEngine:
        with self._lock:
            if v.id not in self._loaded:
                engine = VisionEngine(v.model, v.model_dir, self.pool, self.prep)
                self._loaded[v.id] = engine
                if self.manager is not None:
                    self.manager.adopt_external(v.id, "vision", v.model_dir, engine.vision.memory_bytes(),
                                                lambda vid=v.id: self.close(vid))
            if self.manager is not None:
                self.manager.touch(v.id)
            return self._loaded[v.id]

    def close(self, model_id: str) -> None:
        """Drop a loaded model (the manager's keep_alive or eviction); a run in flight keeps its own."""
        with self._lock:
            self._loaded.pop(model_id, None)


class VisionEngine:
    """What a Conversation needs of an engine (model_id, codec, core.abort), over a VisionModel."""

    def __init__(self, model_id: str, model_dir: Path, pool: ThreadPoolExecutor, prep: ThreadPoolExecutor) -> None:
        self.model_id = model_id
        self.vision = VisionModel(model_dir)
        self.codec = TextCodec(model_dir)
        self.pool = pool
        self.prep = prep
        self.core = self
        self.running: dict[str, threading.Event] = {}

    def abort(self, request_id: str) -> None:
        if request_id in self.running:
            self.running[request_id].set()

    async def submit(self, messages: list[dict[str, Any]], images: list[ImageInput], params: SamplingParams,
                     limits: ImageLimits) -> VisionHandle:
        """Decode and check the images, render and tokenize the prompt, encode the images (a prep
        thread: 400s here, before anything streams), then start the run in the worker thread."""
        def prepare() -> tuple[Any, int]:
            prompt = self.codec.render_chat(messages)
            decoded = [decode(i, limits) for i in images]
            return self.vision.inputs(prompt, decoded, [i.param for i in images])

        named, n_in = await asyncio.get_running_loop().run_in_executor(self.prep, prepare)
        s = Sampling(max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
                     top_k=params.top_k, seed=params.seed, repetition_penalty=params.repetition_penalty)
        handle = VisionHandle(self, uuid.uuid4().hex, n_in, params.stop)
        self.running[handle.id] = handle.stop
        handle.start(named, s)
        return handle


class VisionHandle:
    """Async iterator of one image request's TokenEvents (RequestHandle's shape)."""

    def __init__(self, engine: VisionEngine, request_id: str, input_tokens: int, stops: tuple[str, ...]) -> None:
        self.engine = engine
        self.id = request_id
        self.input_tokens = input_tokens
        self.stops = tuple(s for s in stops if s)
        self.stop = threading.Event()
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

    def start(self, named: Any, s: Sampling) -> None:
        loop = asyncio.get_running_loop()
        put = lambda ev: loop.call_soon_threadsafe(self.queue.put_nowait, ev)
        self.engine.pool.submit(self._run, named, s, put)

    def _run(self, named: Any, s: Sampling, put: Any) -> None:
        start, ids, sent, ttft = time.perf_counter(), [], "", None
        codec = self.engine.codec
        finish, stop_seq = "length", None
        try:
            for step in self.engine.vision.run(named, self.input_tokens, s, self.stop):
                ttft = step.ttft if step.ttft is not None else ttft
                if step.finish is not None:
                    finish = step.finish
                    break
                ids.append(step.token)
                text = codec.decode(ids)
                hit = next(((t, text.index(t)) for t in self.stops if t in text), None)
                if hit is not None:
                    stop_seq, finish = hit[0], "stop"
                    text = text[:hit[1]]
                elif text.endswith("\ufffd"):
                    continue   # a character split across tokens: wait for the rest
                if text[len(sent):]:
                    put(TokenEvent(self.id, text[len(sent):], [step.token or 0]))
                    sent = text
                if hit is not None:
                    break
        except Exception as exc:  # noqa: BLE001 - the request's own error, never the server's
            put(TokenEvent(self.id, "", finished=True, finish_reason="error", error=f"vision generation failed: {exc}"))
            return
        finally:
            self.engine.running.pop(self.id, None)
        took = time.perf_counter() - start
        m = Metrics(model=self.engine.model_id, input_tokens=self.input_tokens, output_tokens=len(ids), ttft=ttft,
                    total_latency=took, output_tokens_per_second=len(ids) / took if took > 0 else 0.0)
        put(TokenEvent(self.id, "", finished=True, finish_reason=finish, metrics=m, stop_sequence=stop_seq))

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenEvent]:
        try:
            while True:
                ev = await self.queue.get()
                yield ev
                if ev.finished:
                    return
        finally:
            self.stop.set()


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
    if turn.tools or turn.functions or turn.response_format or turn.n != 1 or turn.logprobs is not None:
        raise InvalidRequest("tools, response_format, n > 1 and logprobs are not served with vision models yet "
                             "(docs/vision.md)", param="model", code="unsupported_parameter")
    messages, images = flatten(turn.messages, holder.limits)
    return holder, v, messages, images


async def start_vision(st: Any, turn: Any, sampling: Any, span: Any
                       ) -> tuple[VisionEngine, VisionHandle, dict[str, str]] | None:
    """Run a turn with images (or for a vision model) here: its engine, handle and sampling headers;
    None where the turn is for a text engine."""
    routed = route(st, turn)
    if routed is None:
        return None
    holder, v, messages, images = routed
    engine = await asyncio.get_running_loop().run_in_executor(holder.prep, holder.get, v)   # loads on first use
    span.set(model=engine.model_id, provider="local", execution_provider="cpu")
    defaults = defaults_for(st.settings, engine.vision.dir)
    max_tokens = turn.max_tokens
    if turn.max_tokens_is_ceiling and max_tokens is not None:
        max_tokens = min(max_tokens, st.settings.max_tokens_cap)
    params = sampling.to_sampling_params(st.settings.default_max_tokens, st.settings.max_tokens_cap, max_tokens,
                                         defaults)
    handle = await engine.submit(messages, images, params, holder.limits)
    return engine, handle, sampling.sampling_headers(params, defaults)
