"""One loaded vision model: image and text requests as rows of ortserve's batched engine
(engine/embeds_runner.py over vision/rows.py; docs/vision.md "Batched rows").

A request is rendered and tokenized as any chat; each ``<|image_pad|>`` of the prompt becomes the
image's virtual ids (vision/rows.py), its features taken from the encoder's cache by the image's
sha256 or computed once (vision/features.py). The ids go to the engine like any prompt: image
and text requests are queued, prefilled in chunks, decoded in the same batched steps, and the
prefix cache reuses KV by image as well as by text.

og's multimodal generator (vision/runner.py) no longer serves requests: every request for a vision
model runs here (the import's logits check and the tests still run og, as the reference).
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ortserve.engine.embeds_runner import EmbedsEngine, EmbedsModel
from ortserve.engine.engine import RequestHandle
from ortserve.engine.formats import Tool
from ortserve.engine.runtime import session_options
from ortserve.engine.tokenizer import TextCodec
from ortserve.errors import InvalidRequest, ModelError
from ortserve.server.service import submit_n
from ortserve.types import SamplingParams
from ortserve.vision import mistral, qwen
from ortserve.vision.features import Encoder
from ortserve.vision.images import Decoded, ImageInput, ImageLimits, decode
from ortserve.vision.rows import QwenFeed
from ortserve.vision.runner import MARKER, SIDE_FILE


class VisionEngine:
    """What a Conversation needs of an engine (model_id, codec, core.abort), over the batched engine."""

    def __init__(self, model_id: str, model_dir: Path, settings: Any, prep: ThreadPoolExecutor) -> None:
        self.model_id = model_id
        self.dir = Path(model_dir)
        notes_path = self.dir / SIDE_FILE
        if not notes_path.is_file():
            raise ModelError(f"{self.dir} is not a vision model (no {SIDE_FILE})")
        notes = json.loads(notes_path.read_text(encoding="utf-8"))
        self.family = notes.get("family", "qwen2_5_vl")
        gc = json.loads((self.dir / "genai_config.json").read_text(encoding="utf-8"))["model"]
        vis, emb = gc["vision"], gc["embedding"]
        self.image_token_id = int(gc.get("image_token_id", notes.get("image_token_id", 151655)))
        # the engine's threads and spinning: onnxruntime's defaults (every core, spinning) ignored
        # --intra-op-threads and took the cores a loaded machine's other work needs
        self.encoder = Encoder(self.dir / vis["filename"], vis.get("inputs", {}),
                               vis.get("outputs", {}).get("image_features", "image_features"),
                               options=session_options(settings))
        self.pre: Any
        if self.family == "mistral3":   # vision/mistral.py: Pixtral's pixels, [IMG] rows, 1-D positions
            self.pre = mistral.Preprocess.from_config(notes.get("preprocess", {}))
            self.feed: QwenFeed = mistral.MistralFeed(self.dir / emb["filename"], self.image_token_id,
                                                      int(notes["image_break_token_id"]),
                                                      int(notes["image_end_token_id"]))
        else:
            self.pre = qwen.Preprocess.from_config(notes.get("preprocess", {}))
            self.feed = QwenFeed(self.dir / emb["filename"], self.image_token_id)
        self.engine = EmbedsEngine(EmbedsModel(self.dir, self.feed, settings, model_id), settings)
        self.codec: TextCodec = self.engine.codec
        self.prep = prep
        self.core = self
        self.started = False
        self.loop: asyncio.AbstractEventLoop | None = None   # the one the engine's watchdog runs on

    @property
    def vision(self) -> VisionEngine:   # tests and older callers: engine.vision.encoder
        return self

    def memory_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.rglob("*.onnx*"))

    def abort(self, request_id: str) -> None:
        self.engine.core.abort(request_id)

    def close(self) -> None:
        """Stop the engine's watchdog and loop (the holder dropped the model), on the event loop
        that started them; the watchdog would otherwise restart a loop stopped alone."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.engine.stop(), loop)
        else:
            threading.Thread(target=self.engine.core.stop, name="vision-close", daemon=True).start()

    # ---- requests -----------------------------------------------------------------
    def prompt_ids(self, messages: list[dict[str, Any]], images: list[ImageInput], limits: ImageLimits,
                   tools: list[Tool] | None = None, thinking: bool | None = None) -> list[int]:
        """The prompt's token ids with each image's virtual ids in place of its ``<|image_pad|>``
        (decoding, cutting and encoding each image, or taking its features from the cache); the
        tools are described in the prompt as the chat template does for a text engine."""
        if self.family == "mistral3":   # server/vision.py marks images Qwen's way; Mistral's template writes [IMG]
            messages = [{**m, "content": m["content"].replace(MARKER, mistral.MARKER)}
                        if isinstance(m.get("content"), str) else m for m in messages]
        ids = self.codec.chat_ids(messages, tools=tools, thinking=thinking)
        places = ids.count(self.image_token_id)
        if places != len(images):
            raise InvalidRequest(f"the prompt has {places} image places for {len(images)} images",
                                 param=images[0].param if images else "messages")
        virtual = [self._image_ids(decode(image, limits), image.param) for image in images]
        return self.feed.expand(ids, virtual)

    def _image_ids(self, d: Decoded, param: str) -> list[int]:
        """One image's ids in the prompt: its features (cached by sha256, else encoded) registered."""
        if self.family == "mistral3":
            grid = mistral.grid(d.width, d.height, self.pre, param)
            feats = self.encoder.features(d.sha256, lambda: mistral.pixels(d.rgb, self.pre, param), grid)
            return self.feed.register(d.sha256, feats, grid)
        m = self.pre.merge
        grid = qwen.grid(d.width, d.height, self.pre, param)
        feats = self.encoder.features(d.sha256, lambda: qwen.patches(d.rgb, self.pre, param)[0], grid)
        return self.feed.register(d.sha256, feats, (grid[0], grid[1] // m, grid[2] // m))

    async def submit(self, messages: list[dict[str, Any]], images: list[ImageInput], params: SamplingParams,
                     limits: ImageLimits) -> RequestHandle:
        """Decode, check and encode the images in a prep thread (400s here, before anything streams),
        then queue the request in the batched engine."""
        return (await self.submit_n(messages, images, params, limits))[0]

    async def submit_n(self, messages: list[dict[str, Any]], images: list[ImageInput], params: SamplingParams,
                       limits: ImageLimits, n: int = 1, tools: list[Tool] | None = None,
                       thinking: bool | None = None) -> list[RequestHandle]:
        """``submit`` for n choices of one prompt (the images encoded once; the rows after the first
        take its prompt's KV from the prefix cache), as server/service.py submit_n gives a text engine."""
        if not self.started:
            self.started = True
            self.loop = asyncio.get_running_loop()
            await self.engine.start()
        ids = await asyncio.get_running_loop().run_in_executor(self.prep, self.prompt_ids, messages, images, limits,
                                                               tools, thinking)
        return submit_n(self.engine, n, params, prompt_ids=ids)
