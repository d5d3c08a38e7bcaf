"""Images in, text out (issue 42) on a random-weight Qwen2.5-VL (tests/integration/vision_material.py),
imported through ortserve's own import (mobius-onnx's three graphs, og's fixes) once per module:
its logits against transformers, and the chat, Responses and Messages APIs with the real openai and
anthropic clients, streamed and not; bad images are 400s naming the field and the server keeps serving."""

from __future__ import annotations

import base64
import functools
import io
import struct
import zlib
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest
from tests.servers import ServerThread

from ortserve.models.store import Variant

pytest.importorskip("mobius")
MODEL = "tiny-vl"
PROMPT = "<|im_start|>user\n{}What is in the image?<|im_end|>\n<|im_start|>assistant\n"


def png(width: int = 84, height: int = 56, seed: int = 0) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def png_bomb(side: int = 20000) -> bytes:
    """A valid 1-bit PNG of side x side pixels (400 M for 20k) in ~50 kB: all zeros, deflated."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\0" * (1 + (side + 7) // 8)
    z, parts = zlib.compressobj(9), []
    for _ in range(side):
        parts.append(z.compress(row))
    parts.append(z.flush())
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b""))


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def vision(tiny_vl: tuple[Path, Path, Variant]) -> tuple[Path, Path, Variant]:
    """(the Hugging Face dir, ORTSERVE_HOME, the imported store variant): tests/conftest.py's, once a session."""
    return tiny_vl


@pytest.fixture(scope="module")
def srv(tiny_model: Path, vision: tuple[Path, Path, Variant]):
    with ServerThread(tiny_model, home=str(vision[1]), image_max_bytes=100_000, image_max_images=2,
                      image_max_pixels=20_000_000) as s:
        yield s


@functools.cache
def hf_model(hf: Path) -> Any:
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration.from_pretrained(str(hf), dtype=torch.float32).eval()


def hf_logits(hf: Path, ids: np.ndarray, images: list[Any]) -> np.ndarray:
    import torch
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(str(hf))(images=images, return_tensors="pt")
    model = hf_model(hf)
    with torch.no_grad():
        ids_t = torch.from_numpy(ids).long()
        # mm_token_type_ids marks the image tokens: without it transformers 5 computes plain 1-D
        # positions instead of Qwen's mRoPE ones (and og 0.18 did the same without vision_start_token_id)
        out = model(input_ids=ids_t, pixel_values=proc["pixel_values"], image_grid_thw=proc["image_grid_thw"],
                    mm_token_type_ids=(ids_t == model.config.image_token_id).int())
    return out.logits[0, -1].numpy()


def decoded(data: bytes) -> Any:
    from ortserve.vision.images import ImageInput, ImageLimits, decode

    return decode(ImageInput(data, "image"), ImageLimits())


def test_import_records_the_parts_and_agreement(vision: tuple[Path, Path, Variant]) -> None:
    v = vision[2]
    assert v.kind == "vision" and v.architecture == "qwen2_5_vl"
    assert set(v.notes["parts"]) == {"vision", "embedding", "decoder"}
    assert all((v.model_dir / p).is_file() for p in v.notes["parts"].values())
    assert v.quality["logits_max_abs_diff"] < 5e-3 and v.quality["same_argmax"]


def test_first_token_logits_match_transformers_and_follow_the_image(vision: tuple[Path, Path, Variant]) -> None:
    from ortserve.vision.runner import MARKER, VisionModel

    hf, _, v = vision
    model = VisionModel(v.model_dir)
    prompt = PROMPT.format(MARKER)
    logits = {}
    for seed in (0, 1):
        img = decoded(png(seed=seed))
        ours = model.first_logits(prompt, [img], ["image"])
        ids = np.asarray(model.inputs(prompt, [img], ["image"])[0]["input_ids"].as_numpy())
        ref = hf_logits(hf, ids, [img.rgb])   # transformers' own image processor
        assert float(np.abs(ours - ref).max()) < 5e-3
        logits[seed] = ours
    assert float(np.abs(logits[0] - logits[1]).max()) > 1e-2   # another image, other logits: the image is read


def test_two_images_in_one_prompt_match_transformers(vision: tuple[Path, Path, Variant]) -> None:
    from ortserve.vision.runner import MARKER, VisionModel

    hf, _, v = vision
    model = VisionModel(v.model_dir)
    imgs = [decoded(png(seed=2)), decoded(png(56, 56, seed=3))]
    prompt = PROMPT.format(MARKER + "and" + MARKER)
    ours = model.first_logits(prompt, imgs, ["a", "b"])
    ids = np.asarray(model.inputs(prompt, imgs, ["a", "b"])[0]["input_ids"].as_numpy())
    assert float(np.abs(ours - hf_logits(hf, ids, [i.rgb for i in imgs])).max()) < 5e-3


def chat_messages(image: bytes) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is in the image?"},
                                         {"type": "image_url", "image_url": {"url": data_url(image)}}]}]


@pytest.fixture(scope="module")
def client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_chat_streamed_and_not_give_the_same_greedy_answer(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": chat_messages(png()), "max_tokens": 8, "temperature": 0}
    whole = client.chat.completions.create(**kw)
    assert whole.model == MODEL and whole.usage.completion_tokens >= 1
    assert whole.usage.prompt_tokens > 6   # the image's tokens are in the prompt
    chunks = list(client.chat.completions.create(**kw, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    other = client.chat.completions.create(**{**kw, "messages": chat_messages(png(seed=5))})
    assert other.usage.prompt_tokens == whole.usage.prompt_tokens


def test_responses_input_image_streamed_and_not(client: openai.OpenAI) -> None:
    content = [{"type": "input_text", "text": "What is in the image?"},
               {"type": "input_image", "image_url": data_url(png())}]
    kw: dict[str, Any] = {"model": MODEL, "input": [{"role": "user", "content": content}],
                          "max_output_tokens": 8, "temperature": 0}
    whole = client.responses.create(**kw)
    assert whole.status in ("completed", "incomplete") and whole.usage.input_tokens > 6
    events = list(client.responses.create(**kw, stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text


def test_messages_image_block_streamed_and_not(srv: ServerThread) -> None:
    claude = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png()).decode()}}
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "extra_body": {"temperature": 0},
                          "messages": [{"role": "user", "content": [block, {"type": "text", "text": "What?"}]}]}
    whole = claude.messages.create(**kw)
    assert whole.usage.input_tokens > 6 and whole.stop_reason in ("end_turn", "max_tokens")
    with claude.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
    assert text == "".join(b.text for b in whole.content if b.type == "text")
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(**{**kw, "messages": [{"role": "user", "content": [url]}]})
    assert err.value.body["error"]["message"].startswith("'messages.0.content.0.source.url'")


def post_chat(srv: ServerThread, url: str, model: str = MODEL, images: int = 1) -> httpx.Response:
    parts = [{"type": "text", "text": "hi"}] + [{"type": "image_url", "image_url": {"url": url}}] * images
    return httpx.post(f"{srv.url}/v1/chat/completions", timeout=120,
                      json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": parts}]})


@pytest.mark.parametrize(("url", "says"), [
    (data_url(png()[:300]), "truncated or corrupt"),
    (data_url(b"GIF89 not really an image at all"), "is not an image"),
    (data_url(png(400, 300)), "above this server's limit of 100000 bytes"),
    (data_url(png_bomb()), "decompression bomb: Image size (400000000 pixels)"),   # Pillow's guard
    (data_url(png_bomb(5000)), "5000x5000 = 25000000 pixels, above this server's limit of 20000000"),  # ours
    ("https://example.com/cat.png", "no request leaves the machine"),
    ("data:text/plain;base64,aGVsbG8=", "not an image"),
    ("data:image/png;base64,!!!", "not valid base64"),
])
def test_bad_images_are_400s_naming_the_field(srv: ServerThread, url: str, says: str) -> None:
    r = post_chat(srv, url)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages.0.content.1.image_url.url" and says in err["message"], err
    assert post_chat(srv, data_url(png())).status_code == 200   # and the server keeps serving


def test_too_many_images_and_text_only_model_are_400s(srv: ServerThread) -> None:
    r = post_chat(srv, data_url(png()), images=3)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content.3.image_url.url"
    assert "3 images" in r.json()["error"]["message"]
    r = post_chat(srv, data_url(png()), model="tiny")
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content.1.image_url.url"
    assert "reads text only" in r.json()["error"]["message"]


def test_a_repeated_image_is_not_encoded_again(srv: ServerThread, client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": chat_messages(png(seed=7)), "max_tokens": 2, "temperature": 0}
    first = client.chat.completions.create(**kw)
    holder = srv.state.vision
    encoder = holder.engine(MODEL).encoder
    runs, hits = encoder.runs, encoder.hits
    again = client.chat.completions.create(**kw)
    assert encoder.runs == runs and encoder.hits == hits + 1   # same bytes, same sha256: features from the cache
    assert again.choices[0].message.content == first.choices[0].message.content
    # the prefix cache keys on the image too: the same image and text reuse all the prompt's KV but
    # its last token; another image after the same text reuses only the text before the image
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached == again.usage.prompt_tokens - 1
    other = client.chat.completions.create(**{**kw, "messages": chat_messages(png(seed=8))})
    assert encoder.runs == runs + 1
    assert other.usage.prompt_tokens_details.cached_tokens <= cached - 6   # 84x56: 6 image tokens not reused


def test_image_and_text_requests_share_the_engines_steps_over_http(srv: ServerThread, client: openai.OpenAI) -> None:
    """Two image and two text chats: held between two steps while the first decodes, the other
    three queue; released, one decode step runs all four rows, and each answer is its answer alone."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.clocks import EngineHold, wait_until

    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    asks = [chat_messages(png(seed=30)), [{"role": "user", "content": "Name a colour."}],
            chat_messages(png(70, 42, seed=31)), [{"role": "user", "content": "Name a fruit."}]]
    alone = [client.chat.completions.create(messages=m, **kw).choices[0].message.content for m in asks]
    core = srv.state.vision.engine(MODEL).engine.core
    with EngineHold(core) as hold, ThreadPoolExecutor(4) as pool:
        first = pool.submit(client.chat.completions.create, messages=asks[0], **kw)
        assert hold.held.wait(120)   # the first request decodes; the loop waits between two steps
        rest = [pool.submit(client.chat.completions.create, messages=m, **kw) for m in asks[1:]]
        assert wait_until(lambda: len(core.waiting) == 3)
        hold.release()
        together = [f.result(timeout=300).choices[0].message.content for f in [first, *rest]]
    assert core.runner.widest >= 4   # a decode step ran the two image rows and the two text rows
    assert together == alone


def test_a_text_only_turn_on_the_vision_model_and_its_text_routes(srv: ServerThread, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, max_tokens=3, temperature=0,
                                         messages=[{"role": "user", "content": "Hello"}])
    assert out.model == MODEL and out.usage.completion_tokens >= 1
    r = httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and "is a vision model" in r.json()["error"]["message"]


def test_a_loaded_vision_model_shows_in_ps(srv: ServerThread, client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL, max_tokens=1, messages=chat_messages(png(seed=9)))
    names = [m["name"] for m in httpx.get(f"{srv.url}/api/ps", timeout=30).json()["models"]]
    assert any(n.startswith(MODEL) for n in names), names


def test_dropping_a_vision_model_stops_its_engine(srv: ServerThread, client: openai.OpenAI) -> None:
    """keep_alive or eviction drops the model (the holder's close): its engine loop and watchdog stop
    (a watchdog left running would restart the loop, model and all)."""
    from tests.clocks import wait_until

    client.chat.completions.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
    ve = srv.state.vision.engine(MODEL)
    srv.state.vision.close(MODEL)
    assert wait_until(lambda: not ve.engine.core.alive and ve.engine.watchdog._task is None)
    assert not srv.state.vision.loaded()
