"""Mistral 3 (Pixtral vision tower, Mistral text decoder; ``model_type: mistral3``): the image
preprocessing as transformers' ``PixtralImageProcessor`` does it, the image's tokens as
``PixtralProcessor`` lays them out, and the feed of its rows for the batched engine.

* **Pixels.** The image is shrunk (never grown) to fit ``longest_edge`` on both sides, keeping its
  aspect ratio (floor), then each side is rounded up to a multiple of patch x spatial merge (28),
  bicubic; rescaled and normalized with CLIP's mean and std; fed whole ([1, 3, H, W]) to the
  vision graph, which gives one feature row per 28x28 cell, row by row.
* **Tokens.** One ``[IMG]`` per cell; each row of cells ends with ``[IMG_BREAK]``, the last with
  ``[IMG_END]`` instead. The chat template writes one ``[IMG]`` per image; the engine expands it.
* **Positions.** Plain 1-D: the token's place in the row (no rope deltas). The decoder mobius-onnx
  exports takes no ``position_ids`` at all (its attention counts them from the mask), so the feed's
  positions are what the graph computes anyway.

The feed is ``QwenFeed``'s image bookkeeping (virtual ids by image serial, the feature budget, the
embedding graph that splices features at the image token) with Mistral's layout and positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import InvalidRequest
from ortserve.vision.rows import QwenFeed

MARKER = "[IMG]"   # one image's place in a rendered prompt
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class Preprocess:
    patch: int = 14
    merge: int = 2
    longest_edge: int = 1540
    mean: tuple[float, float, float] = MEAN
    std: tuple[float, float, float] = STD

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Preprocess:
        return cls(int(cfg.get("patch_size", 14)), int(cfg.get("spatial_merge_size", 2)),
                   int(cfg.get("longest_edge", 1540)), tuple(cfg.get("image_mean", MEAN)),  # type: ignore[arg-type]
                   tuple(cfg.get("image_std", STD)))  # type: ignore[arg-type]


def resized(width: int, height: int, pre: Preprocess, param: str = "image") -> tuple[int, int]:
    """(width, height) after the resize: within longest_edge, sides multiples of patch x merge."""
    if max(height, width) > 200 * min(height, width):
        raise InvalidRequest(f"'{param}' is {width}x{height}: an aspect ratio above 200 is not served",
                             param=param, code="invalid_image")
    ratio = max(height / pre.longest_edge, width / pre.longest_edge)
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    cell = pre.patch * pre.merge
    return ((width - 1) // cell + 1) * cell, ((height - 1) // cell + 1) * cell


def grid(width: int, height: int, pre: Preprocess, param: str = "image") -> tuple[int, int, int]:
    """(1, rows, columns) of the image's token cells: one feature row and one [IMG] per cell."""
    w, h = resized(width, height, pre, param)
    cell = pre.patch * pre.merge
    return 1, h // cell, w // cell


def pixels(rgb: Any, pre: Preprocess, param: str = "image") -> np.ndarray:
    """One RGB PIL image -> pixel_values [1, 3, H, W] float32, as PixtralImageProcessor makes them."""
    from PIL import Image

    w, h = resized(*rgb.size, pre, param)
    if (w, h) != tuple(rgb.size):
        rgb = rgb.resize((w, h), Image.Resampling.BICUBIC)
    x = np.asarray(rgb, dtype=np.float32) / 255.0
    x = (x - np.asarray(pre.mean, dtype=np.float32)) / np.asarray(pre.std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


class MistralFeed(QwenFeed):
    """Mistral 3's rows: the image's virtual ids row by row with ``[IMG_BREAK]`` / ``[IMG_END]``
    between them, and 1-D positions."""

    position_rows = 1

    def __init__(self, embedding: Path, image_token_id: int, break_id: int, end_id: int,
                 max_bytes: int = 256 << 20) -> None:
        super().__init__(embedding, image_token_id, max_bytes)
        self.break_id, self.end_id = break_id, end_id

    def register(self, sha256: str, features: np.ndarray, grid: tuple[int, int, int]) -> list[int]:
        """The ids one ``[IMG]`` of the prompt becomes: each row's virtual ids, then the row's end."""
        cells = super().register(sha256, features, grid)
        _, rows, cols = grid
        out: list[int] = []
        for r in range(rows):
            out.extend(cells[r * cols:(r + 1) * cols])
            out.append(self.end_id if r == rows - 1 else self.break_id)
        return out

    def positions(self, held: np.ndarray, start: int) -> np.ndarray:
        return np.arange(start, len(held), dtype=np.int64)[None]

    def offset(self, held: np.ndarray) -> int:
        return 0


def first_logits(feed: MistralFeed, decoder: Path, ids: list[int]) -> np.ndarray:
    """The decoder's logits after ``ids`` (virtual image ids among them, registered in ``feed``),
    run once on an empty KV cache: the import's check against transformers."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(decoder), providers=["CPUExecutionProvider"])
    embeds = feed.embed(np.asarray(ids, dtype=np.int64))[None]
    feeds: dict[str, np.ndarray] = {"inputs_embeds": embeds, "attention_mask": np.ones((1, len(ids)), np.int64)}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((1, int(i.shape[1]), 0, int(i.shape[3])), dtype=np.float32)
        elif i.name == "position_ids":
            feeds[i.name] = feed.positions(np.asarray(ids), 0)
    return np.asarray(sess.run(["logits"], feeds)[0])[0, -1].astype(np.float32)
