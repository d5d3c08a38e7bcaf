"""Image decoding, limits and Qwen2.5-VL's patches without a model (src/ortserve/vision)."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pytest

from ortserve.errors import InvalidRequest
from ortserve.vision import qwen
from ortserve.vision.images import ImageInput, ImageLimits, check_count, decode, from_url


def png(width: int, height: int, seed: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def refused(fn: Any, *args: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        fn(*args)
    assert err.value.param == "p"
    return err.value


def test_urls() -> None:
    limits = ImageLimits(max_bytes=10_000)
    assert from_url(url(png(8, 8)), "p", limits).data == png(8, 8)
    assert "no request leaves the machine" in refused(from_url, "https://x/cat.png", "p", limits).message
    assert "data:image" in refused(from_url, "file:///etc/passwd", "p", limits).message
    assert "not valid base64" in refused(from_url, "data:image/png;base64,@@", "p", limits).message
    assert "10000 bytes" in refused(from_url, url(png(200, 200)), "p", limits).message


def test_decode_and_pixel_limit() -> None:
    limits = ImageLimits(max_pixels=100 * 100)
    img = decode(ImageInput(png(30, 20), "p"), limits)
    assert (img.width, img.height, img.format) == (30, 20, "PNG") and img.sha256
    assert "101x100 = 10100 pixels" in refused(decode, ImageInput(png(101, 100), "p"), limits).message
    assert "truncated or corrupt" in refused(decode, ImageInput(png(30, 20)[:100], "p"), limits).message
    assert "is not an image" in refused(decode, ImageInput(b"hello there", "p"), limits).message


def test_count_names_the_first_image_past_the_limit() -> None:
    images = [ImageInput(b"x", f"m.{i}") for i in range(3)]
    with pytest.raises(InvalidRequest) as err:
        check_count(images, ImageLimits(max_images=2))
    assert err.value.param == "m.2"


@pytest.mark.parametrize(("width", "height"), [(84, 56), (100, 70), (30, 500), (640, 480)])
def test_patches_match_transformers_processor(width: int, height: int) -> None:
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pre = qwen.Preprocess(min_pixels=3136, max_pixels=200704)
    rgb = Image.open(io.BytesIO(png(width, height))).convert("RGB")
    ours, grid = qwen.patches(rgb, pre)
    ref = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=200704)(images=[rgb], return_tensors="np")
    assert grid == tuple(ref["image_grid_thw"][0]) == qwen.grid(width, height, pre)
    # the same resize (PIL bicubic), normalization and patch order: equal to float rounding
    assert float(np.abs(ours - ref["pixel_values"]).max()) < 1e-5
