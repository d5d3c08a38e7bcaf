"""A second vision family (issue 42): Mistral 3 (Pixtral tower, Mistral decoder) on a random-weight
model built from a config (tests/integration/mistral3_material.py), imported through ortserve's own
import (mobius-onnx's three graphs, og's fixes, the logits check). Its pixels equal transformers'
PixtralImageProcessor's; the batched engine's rows (vision/mistral.py: [IMG] rows with [IMG_BREAK] /
[IMG_END], 1-D positions) give transformers' greedy tokens, image and text rows in the same decode
steps; the chat and Messages APIs answer with an image through the real openai and anthropic
clients, streamed equal to whole; a bad image is a 400 naming its field."""

from __future__ import annotations

import asyncio
import base64
import functools
import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest
from tests.servers import ServerThread

from ortserve.models.store import Variant
from ortserve.types import SamplingParams

pytest.importorskip("mobius")
MODEL = "tiny-m3"
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def png(width: int = 84, height: int = 56, seed: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def m3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Variant]:
    """(the Hugging Face dir, ORTSERVE_HOME, the imported variant), once for this module."""
    from tests.integration.mistral3_material import build_hf_dir
    from tests.integration.vision_material import import_material

    return import_material(tmp_path_factory, build_hf_dir, "m3", MODEL)


@functools.cache
def hf_model(hf: Path) -> Any:
    import torch
    from transformers import Mistral3ForConditionalGeneration

    return Mistral3ForConditionalGeneration.from_pretrained(str(hf), dtype=torch.float32).eval()


def test_import_checks_the_logits_against_transformers(m3: tuple[Path, Path, Variant]) -> None:
    import json

    v = m3[2]
    assert v.kind == "vision" and v.architecture == "mistral3"
    assert all((v.model_dir / p).is_file() for p in v.notes["parts"].values())
    assert (v.notes["image_token_id"], v.notes["image_break_token_id"], v.notes["image_end_token_id"]) == (
        32000, 32001, 32002)
    assert v.quality["logits_max_abs_diff"] < 5e-3 and v.quality["same_argmax"]
    assert json.loads((v.model_dir / "genai_config.json").read_text())["model"]["type"] == "mistral3"


@pytest.mark.parametrize(("width", "height"), [(84, 56), (400, 150), (30, 500), (27, 27)])
def test_pixels_equal_transformers_pixtral_processor(m3: tuple[Path, Path, Variant], width: int,
                                                     height: int) -> None:
    from PIL import Image
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    from ortserve.vision import mistral

    pre = mistral.Preprocess.from_config(m3[2].notes["preprocess"])
    rgb = Image.open(io.BytesIO(png(width, height, seed=width))).convert("RGB")
    ref = PixtralImageProcessorPil(patch_size={"height": 28, "width": 28}, size={"longest_edge": 336})(
        images=[rgb], return_tensors="np")
    ours = mistral.pixels(rgb, pre)
    assert ours.shape == ref["pixel_values"].shape and [list(ours.shape[2:])] == ref["image_sizes"].tolist()
    assert float(np.abs(ours - ref["pixel_values"]).max()) < 1e-5
    _, rows, cols = mistral.grid(width, height, pre)
    assert (rows * 28, cols * 28) == ours.shape[2:]


def load(v: Variant) -> Any:
    from ortserve.server.vision_engine import VisionEngine

    settings = SimpleNamespace(max_batch=8, kv_cache_mb=64, prefill_chunk=512, prefix_cache=True, huge_pages=False)
    return VisionEngine(v.model, v.model_dir, settings, ThreadPoolExecutor(1))


def test_engine_rows_give_transformers_greedy_tokens(m3: tuple[Path, Path, Variant]) -> None:
    """Two image requests (one shrunk to the longest edge: 5 rows of 12 cells) and a text request,
    queued before one step: a decode step runs all three rows, and each gives transformers' greedy
    tokens on the same prompt."""
    import torch

    from ortserve.vision import mistral
    from ortserve.vision.images import ImageInput, ImageLimits, decode
    from ortserve.vision.rows import BASE
    from ortserve.vision.runner import MARKER

    hf, _, v = m3
    turns = [([{"role": "user", "content": MARKER + "What is in the image?"}], [ImageInput(png(seed=1), "image")]),
             ([{"role": "user", "content": "Describe it." + MARKER}], [ImageInput(png(400, 150, seed=2), "image")]),
             ([{"role": "user", "content": "Tell me about the sea."}], [])]

    async def run() -> tuple[list[list[int]], list[list[int]], int]:
        ve = load(v)
        seqs: dict[str, Any] = {}
        add = ve.engine.core.add
        ve.engine.core.add = lambda seq: (seqs.__setitem__(seq.id, seq), add(seq))[1]
        try:
            ve.started = True
            await ve.engine.start()
            ids = [await asyncio.get_running_loop().run_in_executor(None, ve.prompt_ids, m, i, ImageLimits())
                   for m, i in turns]
            with ve.engine.core._cond:   # the loop waits on this lock: all three are queued before its next step
                handles = [ve.engine.submit(prompt_ids=x, params=GREEDY) for x in ids]
            for h in handles:
                async for ev in h:
                    assert ev.error is None, ev.error
            return ids, [list(seqs[h.id].output_ids) for h in handles], ve.engine.core.runner.widest
        finally:
            await ve.engine.stop()

    ids, got, widest = asyncio.run(run())
    assert widest == 3
    wide = np.asarray(ids[1])
    assert (wide >= BASE).sum() == 60 and list(wide).count(32001) == 4 and list(wide).count(32002) == 1
    assert wide[np.flatnonzero(wide >= BASE)[-1] + 1] == 32002   # [IMG_END] closes the last row
    model = hf_model(hf)
    pre = mistral.Preprocess.from_config(v.notes["preprocess"])
    for (_, images), prompt, tokens in zip(turns, ids, got, strict=True):
        real = torch.tensor([[i if i < BASE else 32000 for i in prompt]])
        kw: dict[str, Any] = {}
        if images:
            pv = mistral.pixels(decode(images[0], ImageLimits()).rgb, pre)
            kw = {"pixel_values": torch.from_numpy(pv), "image_sizes": torch.tensor([list(pv.shape[2:])])}
        with torch.no_grad():
            want = model.generate(real, max_new_tokens=8, do_sample=False, **kw)[0, real.shape[1]:].tolist()
        assert tokens == want
    assert ids[0][:4] == ids[2][:4]  # the same template head


def test_another_image_moves_the_logits(m3: tuple[Path, Path, Variant]) -> None:
    from tokenizers import Tokenizer

    from ortserve.vision import mistral
    from ortserve.vision.features import Encoder
    from ortserve.vision.images import ImageInput, ImageLimits, decode

    v = m3[2]
    d = v.model_dir
    pre = mistral.Preprocess.from_config(v.notes["preprocess"])
    enc = Encoder(d / "vision_encoder/model.onnx", {}, "image_features")
    feed = mistral.MistralFeed(d / "embedding/model.onnx", 32000, 32001, 32002)
    text = Tokenizer.from_file(str(d / "tokenizer.json")).encode("<s>[INST][IMG]What?[/INST]",
                                                                 add_special_tokens=False).ids
    logits = []
    for seed in (0, 1):
        img = decode(ImageInput(png(seed=seed), "image"), ImageLimits())
        grid = mistral.grid(img.width, img.height, pre)
        feats = enc.features(img.sha256, lambda img=img: mistral.pixels(img.rgb, pre), grid)
        logits.append(mistral.first_logits(feed, d / "decoder/model.onnx",
                                           feed.expand(text, [feed.register(img.sha256, feats, grid)])))
    assert float(np.abs(logits[0] - logits[1]).max()) > 1e-2


@pytest.fixture(scope="module")
def srv(tiny_model: Path, m3: tuple[Path, Path, Variant]):
    with ServerThread(tiny_model, home=str(m3[1]), image_max_bytes=100_000) as s:
        yield s


def data_url(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


def test_chat_messages_and_responses_with_an_image_streamed_and_not(srv: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    content = [{"type": "text", "text": "What is in the image?"},
               {"type": "image_url", "image_url": {"url": data_url(png(seed=3))}}]
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "temperature": 0,
                          "messages": [{"role": "user", "content": content}]}
    whole = client.chat.completions.create(**kw)
    assert whole.model == MODEL and whole.usage.completion_tokens >= 1
    # "<s>[INST]" + text + 2 rows of 3 cells, each row closed + "[/INST]": the image's 8 ids are in the count
    assert whole.usage.prompt_tokens > 8 + 6
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                       if c.choices)
    assert streamed == whole.choices[0].message.content

    claude = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png(seed=3)).decode()}}
    mkw: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "extra_body": {"temperature": 0},
                           "messages": [{"role": "user", "content": [{"type": "text", "text": "What is in the image?"},
                                                                     block]}]}
    msg = claude.messages.create(**mkw)
    # the same prompt, the same ids: all but the last token's KV from the prefix cache (it keys on the image)
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == whole.usage.prompt_tokens
    assert msg.usage.cache_read_input_tokens == whole.usage.prompt_tokens - 1
    assert "".join(b.text for b in msg.content if b.type == "text") == whole.choices[0].message.content
    with claude.messages.stream(**mkw) as stream:
        assert "".join(stream.text_stream) == whole.choices[0].message.content

    # the Responses API, input_image, streamed and not: the same turn, the same greedy text
    rkw: dict[str, Any] = {"model": MODEL, "max_output_tokens": 8, "temperature": 0, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is in the image?"}, {"type": "input_image", "image_url": data_url(png(seed=3))}]}]}
    resp = client.responses.create(**rkw)
    assert resp.output_text == whole.choices[0].message.content and resp.usage.input_tokens == whole.usage.prompt_tokens
    events = list(client.responses.create(**rkw, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == resp.output_text


def test_a_bad_image_is_a_400_naming_the_field(srv: ServerThread) -> None:
    parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": data_url(b"not a png")}}]
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=120,
                   json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages.0.content.1.image_url.url"
    parts[1] = {"type": "image_url", "image_url": {"url": data_url(png(2000, 8))}}   # aspect 250 > 200
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=120,
                   json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 400 and "aspect ratio" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "messages.0.content.1.image_url.url"
