"""Qwen2.5-VL's image preprocessing, as transformers' Qwen2VLImageProcessor does it: resize to a
multiple of 28 within [min_pixels, max_pixels] (bicubic), rescale, normalize, then cut 14x14
patches, each repeated over the 2 temporal slots and ordered by 2x2 merge window.

onnxruntime-genai 0.18's own processor orders the patches row by row with the temporal slot
before the channel, and its image decoder swaps red and blue with the processor_config.json that
exporters write; the vision graph (like transformers) expects the layout below, so ortserve cuts
the patches itself and hands og the finished ``pixel_values``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ortserve.errors import InvalidRequest

PATCH, MERGE, TEMPORAL = 14, 2, 2
FACTOR = PATCH * MERGE
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


@dataclass(frozen=True)
class Preprocess:
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280   # 1280 image tokens at most, transformers' default
    patch: int = PATCH
    merge: int = MERGE
    temporal: int = TEMPORAL

    @classmethod
    def from_config(cls, cfg: dict) -> Preprocess:
        return cls(int(cfg.get("min_pixels", cls.min_pixels)), int(cfg.get("max_pixels", cls.max_pixels)),
                   int(cfg.get("patch_size", PATCH)), int(cfg.get("merge_size", MERGE)),
                   int(cfg.get("temporal_patch_size", TEMPORAL)))


def smart_resize(height: int, width: int, pre: Preprocess, param: str = "image") -> tuple[int, int]:
    factor = pre.patch * pre.merge
    if max(height, width) > 200 * min(height, width):
        raise InvalidRequest(f"'{param}' is {width}x{height}: an aspect ratio above 200 is not served",
                             param=param, code="invalid_image")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > pre.max_pixels:
        beta = math.sqrt(height * width / pre.max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < pre.min_pixels:
        beta = math.sqrt(pre.min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def grid(width: int, height: int, pre: Preprocess, param: str = "image") -> tuple[int, int, int]:
    """The (t, h, w) patch grid an image of this size becomes."""
    h, w = smart_resize(height, width, pre, param)
    return 1, h // pre.patch, w // pre.patch


def patches(rgb: object, pre: Preprocess, param: str = "image") -> tuple[np.ndarray, tuple[int, int, int]]:
    """One RGB PIL image -> (pixel_values [patches, 3*2*14*14] float32, its grid (t, h, w))."""
    from PIL import Image

    width, height = rgb.size  # type: ignore[attr-defined]
    h, w = smart_resize(height, width, pre, param)
    if (w, h) != (width, height):
        rgb = rgb.resize((w, h), Image.Resampling.BICUBIC)  # type: ignore[attr-defined]
    x = (np.asarray(rgb, dtype=np.float32) / 255.0 - MEAN) / STD          # H, W, C
    x = np.repeat(x.transpose(2, 0, 1)[None], pre.temporal, axis=0)       # T, C, H, W
    gh, gw, p, m = h // pre.patch, w // pre.patch, pre.patch, pre.merge
    x = x.reshape(1, pre.temporal, 3, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * pre.temporal * p * p)), (1, gh, gw)


def image_tokens(grid: tuple[int, int, int], pre: Preprocess) -> int:
    t, h, w = grid
    return t * h * w // (pre.merge * pre.merge)
