"""The chat page on a server whose pinned start model is the random-weight Qwen2.5-VL (tests/conftest.py's
``tiny_vl``; docs/vision.md "A vision model as the start model"), in a real Chromium: the page picks it
first, shows the Image button at once, and an attached image goes to it and gets a streamed answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import ServerThread
from test_ui_vision import png

SERVED = "tiny-vl:fp32-cpu"


@pytest.fixture(scope="module")
def vl_start(tiny_vl: tuple[Path, Path, Any]) -> Iterator[ServerThread]:
    with ServerThread(tiny_vl[2].model_dir, model_id=SERVED, home=str(tiny_vl[1])) as s:
        yield s


def test_the_page_on_a_vision_start_model(vl_start: ServerThread, open_page: Any, tmp_path: Path) -> None:
    w = open_page(vl_start.url)
    page = w.page
    page.wait_for_selector(f"#model option[value='{SERVED}']", state="attached")
    assert page.eval_on_selector("#model", "s => s.value") == SERVED   # the pinned model, first
    page.wait_for_selector("#attach", state="visible")                  # a vision model: the Image button
    picture = tmp_path / "picture.png"
    picture.write_bytes(png(56, 40))
    page.set_input_files("#image-file", str(picture))
    page.wait_for_selector("#attached img")
    page.click("#settings summary")
    page.fill("#max-tokens", "4")
    page.fill("#prompt", "What is in this picture?")
    pinned = vl_start.state.vision.pinned[1]
    runs = pinned.encoder.runs
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as sent:
        page.click("#send")
    body = json.loads(sent.value.post_data)
    assert body["model"] == SERVED and body["messages"][-1]["content"][1]["type"] == "image_url"
    page.wait_for_function("!document.body.classList.contains('busy') && "
                           "/finish:/.test(document.querySelector('.msg.assistant .meta').textContent)", timeout=120_000)
    answer = page.evaluate("window.ortChat.state.convs[0].messages[1]")
    assert answer["content"] and not answer.get("error") and answer["meta"]["tokens"] >= 1
    assert pinned.encoder.runs == runs + 1                                 # the pinned engine read the image
    assert [r["model"] for r in vl_start.state.manager.ps()] == [SERVED]   # and no text engine was loaded
    assert w.errors == [] and not w.outside(), (w.errors, w.outside())
