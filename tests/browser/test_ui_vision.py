"""Images on the chat page, in a real Chromium, against the random-weight Qwen2.5-VL (tests/conftest.py's
``tiny_vl``, built once a session): an attached PNG is shown as a thumbnail, sent as an OpenAI
``image_url`` data URL with the message, read by the vision encoder (its run counter), and a streamed
answer comes back (random tokens: the words are not checked); a pasted image needs a vision model;
the server's 400 for an image over its byte limit shows in the page."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from servers import ServerThread


def png(side: int, seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vl_srv(tiny_model: Path, tiny_vl: tuple[Path, Path, Any]) -> Iterator[ServerThread]:
    with ServerThread(tiny_model, home=str(tiny_vl[1]), image_max_bytes=100_000) as s:
        yield s


PASTE = """([b64, name]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const dt = new DataTransfer();
  dt.items.add(new File([bytes], name, { type: "image/png" }));
  document.getElementById("prompt").dispatchEvent(
    new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true }));
}"""


def test_attach_an_image_and_get_a_streamed_answer(vl_srv: ServerThread, open_page: Any, tmp_path: Path) -> None:
    vl = next(m["id"] for m in httpx.get(vl_srv.url + "/v1/models", timeout=60).json()["data"] if m["kind"] == "vision")
    w = open_page(vl_srv.url)
    page = w.page
    page.wait_for_selector(f"#model option[value='{vl}']", state="attached")
    assert page.is_hidden("#attach")                                  # the text model: no image button
    page.evaluate(PASTE, [base64.b64encode(png(32, 1)).decode(), "pasted.png"])
    assert "reads text only" in page.inner_text("#status") and page.locator("#attached img").count() == 0
    page.select_option("#model", vl)
    assert page.is_visible("#attach")
    picture = tmp_path / "picture.png"
    picture.write_bytes(png(56, 30))
    page.set_input_files("#image-file", str(picture))
    page.wait_for_selector("#attached img")
    page.evaluate(PASTE, [base64.b64encode(png(40, 31)).decode(), "pasted.png"])   # a paste joins it
    page.wait_for_function("document.querySelectorAll('#attached img').length === 2")
    page.click("#attached .unattach >> nth=1")                        # and is removed again
    assert page.locator("#attached img").count() == 1
    page.click("#settings summary")
    page.fill("#max-tokens", "6")
    page.fill("#prompt", "What is in this picture?")
    holder = vl_srv.state.vision
    runs = holder.engine(vl).encoder.runs if holder._loaded else 0
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as sent:
        page.click("#send")
    body = json.loads(sent.value.post_data)
    assert body["model"] == vl and body["stream"] is True
    content = body["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": "What is in this picture?"}
    assert content[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(picture.read_bytes()).decode()
    page.wait_for_function("!document.body.classList.contains('busy') && "
                           "/finish:/.test(document.querySelector('.msg.assistant .meta').textContent)", timeout=120_000)
    answer = page.evaluate("window.ortChat.state.convs[0].messages[1]")
    assert answer["content"] and not answer.get("error") and answer["meta"]["tokens"] >= 1
    assert holder.engine(vl).encoder.runs == runs + 1   # the image reached the encoder
    assert page.locator(".msg.user .thumbs img").count() == 1          # shown in the conversation
    assert page.locator("#attached img").count() == 0
    # an image over the server's byte limit (100 kB here): its 400, naming the field, in the page
    big = tmp_path / "big.png"
    big.write_bytes(png(300, 32))
    page.set_input_files("#image-file", str(big))
    page.wait_for_selector("#attached img")
    page.fill("#prompt", "And this one?")
    page.click("#send")
    page.wait_for_selector(".msg.assistant .error")
    error = page.inner_text(".msg.assistant >> nth=1")
    assert "messages.2.content.1.image_url.url" in error and "above this server's limit" in error, error
    assert [e for e in w.errors if "status of 400" not in e] == [] and not w.outside(), (w.errors, w.outside())
