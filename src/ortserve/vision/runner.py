"""A vision-language model on onnxruntime-genai's multimodal generator (Qwen2.5-VL first).

og runs the three graphs the import wrote (vision: pixel_values + image_grid_thw -> image
features; embedding: input ids + image features -> inputs_embeds; decoder with Qwen's 3-row
mRoPE positions, which og computes from the grid). ortserve prepares the inputs itself
(``qwen.patches``: transformers' patch layout) and expands each ``<|image_pad|>`` of the rendered
prompt to the image's token count.

Serving no longer runs here: every request for a vision model is a row of ortserve's batched
engine (engine/embeds_runner.py, vision/rows.py, server/vision_engine.py). og's generator stays
as the reference: the import's logits check against transformers and the tests that the
batched rows give its tokens. The vision encoder runs in ortserve (features.py) so its features
are cached by image hash; og gets them through a pass-through vision graph.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import InvalidRequest, ModelError
from ortserve.vision import qwen
from ortserve.vision.features import PASSTHROUGH, Encoder, passthrough_graph
from ortserve.vision.images import Decoded

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
MARKER = VISION_START + IMAGE_PAD + VISION_END   # one image's place in a rendered prompt
SIDE_FILE = "vision.json"                          # ortserve's notes beside the og files


@dataclass
class Sampling:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    repetition_penalty: float = 1.0


@dataclass
class Step:
    """One generated token (``token``) or the end (``finish`` set)."""

    token: int | None = None
    finish: str | None = None
    input_tokens: int = 0
    ttft: float | None = None


def special_id(model_dir: Path, text: str) -> int | None:
    """The id tokenizer.json gives an added (special) token, by its text."""
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    return next((int(a["id"]) for a in tok.get("added_tokens", []) if a.get("content") == text), None)


class VisionModel:
    """og's Model over a store directory with vision, embedding and decoder graphs."""

    def __init__(self, model_dir: Path) -> None:
        import onnxruntime_genai as og

        self.dir = Path(model_dir)
        notes_path = self.dir / SIDE_FILE
        if not notes_path.is_file():
            raise ModelError(f"{self.dir} is not a vision model (no {SIDE_FILE})")
        self.notes: dict[str, Any] = json.loads(notes_path.read_text(encoding="utf-8"))
        self.pre = qwen.Preprocess.from_config(self.notes.get("preprocess", {}))
        self.og = og
        gc = json.loads((self.dir / "genai_config.json").read_text(encoding="utf-8"))["model"]
        vis = gc["vision"]
        out = vis.get("outputs", {}).get("image_features", "image_features")
        self.encoder = Encoder(self.dir / vis["filename"], vis.get("inputs", {}), out)
        cfg = og.Config(str(self.dir))   # og gets the pass-through graph; ortserve runs the encoder (features.py)
        # og keeps a pointer to these bytes, not a reference: they must live as long as the model
        self._passthrough = passthrough_graph(vis.get("inputs", {}), out, self.encoder.width, self.pre.merge)
        cfg.add_model_data(PASSTHROUGH, self._passthrough)
        overlay: dict[str, Any] = {"vision": {"filename": PASSTHROUGH}}
        start_id = special_id(self.dir, VISION_START)
        if "vision_start_token_id" not in gc and start_id is not None:
            # without it og 0.18 finds no image in the ids and feeds plain 1-D positions on all three
            # mRoPE rows (the import did not write it; vision/rows.py computes Qwen's real positions)
            overlay["vision_start_token_id"] = start_id
        cfg.overlay(json.dumps({"model": overlay}))
        self.model = og.Model(cfg)
        self.tokenizer = og.Tokenizer(self.model)
        self.context = int(gc.get("context_length", 4096))
        eos = gc.get("eos_token_id", [])
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.lock = threading.Lock()   # og's generator here runs one image request at a time

    def memory_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.rglob("*.onnx*"))

    def inputs(self, prompt: str, images: list[Decoded], params: list[str]) -> tuple[Any, int]:
        """og's named inputs for a rendered prompt with one MARKER per image, and its token count."""
        if prompt.count(VISION_START) != len(images):
            raise InvalidRequest(f"the prompt has {prompt.count(VISION_START)} image places for {len(images)} "
                                 "images", param=params[0] if params else "messages")
        pixel, grids, text, rest = [], [], [], prompt
        for image, param in zip(images, params, strict=True):
            head, _, rest = rest.partition(MARKER)
            grid = qwen.grid(image.width, image.height, self.pre, param)
            pixel.append(self.encoder.features(image.sha256, lambda i=image, p=param: qwen.patches(i.rgb, self.pre, p)[0],
                                               grid))
            grids.append(grid)
            text.append(head + VISION_START + IMAGE_PAD * qwen.image_tokens(grid, self.pre) + VISION_END)
        ids = np.asarray(self.tokenizer.encode("".join(text) + rest), dtype=np.int32)[None]
        if ids.shape[1] >= self.context:
            raise InvalidRequest(f"the prompt is {ids.shape[1]} tokens with its images, at or above this "
                                 f"model's context of {self.context}", param="messages",
                                 code="context_length_exceeded")
        named = self.og.NamedTensors()
        named["input_ids"] = ids
        if images:
            rows = self.pre.merge * self.pre.merge   # one row per patch, as og counts them (features.py)
            named["pixel_values"] = np.concatenate(pixel).reshape(-1, self.encoder.width // rows)
            named["image_grid_thw"] = np.asarray(grids, dtype=np.int64)
            named["num_image_tokens"] = np.asarray([sum(qwen.image_tokens(g, self.pre) for g in grids)],
                                                   dtype=np.int64)
        return named, int(ids.shape[1])

    def _generator(self, named: Any, n_in: int, s: Sampling) -> Any:
        gp = self.og.GeneratorParams(self.model)
        opts: dict[str, Any] = {"max_length": min(self.context, n_in + s.max_tokens)}
        if s.temperature > 0:
            opts.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or 0)
        else:
            opts.update(do_sample=False, top_k=1)
        if s.repetition_penalty != 1.0:
            opts["repetition_penalty"] = s.repetition_penalty
        if s.seed is not None:
            opts["random_seed"] = int(s.seed)
        gp.set_search_options(**opts)
        g = self.og.Generator(self.model, gp)
        g.set_inputs(named)
        return g

    def first_logits(self, prompt: str, images: list[Decoded], params: list[str]) -> np.ndarray:
        """The logits after the prompt (images encoded): the agreement check's number."""
        named, n_in = self.inputs(prompt, images, params)
        with self.lock:
            g = self._generator(named, n_in, Sampling(max_tokens=1, temperature=0.0))
            return np.asarray(g.get_output("logits"))[0, -1].astype(np.float32)

    def run(self, named: Any, n_in: int, s: Sampling, stop: threading.Event | None = None) -> Iterator[Step]:
        """Token ids as they are generated from prepared inputs (``inputs``), then a Step with the
        finish reason; ``stop`` set ends it early."""
        with self.lock:
            start = time.perf_counter()
            g = self._generator(named, n_in, s)
            made, ttft = 0, None
            while made < s.max_tokens:
                if stop is not None and stop.is_set():
                    return
                g.generate_next_token()
                token = int(g.get_next_tokens()[0])
                if token in self.eos:
                    yield Step(finish="stop", input_tokens=n_in, ttft=ttft)
                    return
                made += 1
                ttft = ttft if ttft is not None else time.perf_counter() - start
                yield Step(token=token, input_tokens=n_in, ttft=ttft)
                if g.is_done():
                    break
            yield Step(finish="length", input_tokens=n_in, ttft=ttft)
