r"""Screenshots of the chat page (light, dark, phone) and the dashboard, taken by a real Chromium.

In the suite they go to a temporary directory (tiny model: random words). For the docs:
    ORTSERVE_UI_SHOTS=docs/img ORTSERVE_UI_SHOTS_MODEL=default .venv/bin/python -m pytest -q \\
        tests/browser/test_ui_screenshots.py
"""

from __future__ import annotations

import concurrent.futures
import os
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import ServerThread

PROMPT = "Write a Python function that tells whether a number is prime, then explain it in one sentence."


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    w, h = struct.unpack(">II", head[16:24])
    return int(w), int(h)


def test_screenshots(request: pytest.FixtureRequest, tiny_model: Path, open_page: Any, tmp_path: Path) -> None:
    out = Path(os.environ.get("ORTSERVE_UI_SHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    real = os.environ.get("ORTSERVE_UI_SHOTS_MODEL") == "default"
    model, model_id = (request.getfixturevalue("default_model"), "smollm2-135m") if real else (tiny_model, "tiny")
    home = tmp_path / "home"
    with ServerThread(model, model_id=model_id, home=str(home)) as srv:
        w = open_page(srv.url)
        page = w.page
        page.wait_for_selector("#model option", state="attached")
        page.click("#settings summary")
        page.fill("#max-tokens", "160")
        page.fill("#temperature", "0.2")
        page.fill("#system", "You are a concise coding assistant.")
        page.click("#settings summary")
        page.fill("#prompt", PROMPT)
        page.keyboard.press("Enter")
        page.wait_for_selector("#send:not([hidden])", timeout=120_000)
        page.screenshot(path=str(out / "ui-chat-light.png"))
        page.emulate_media(color_scheme="dark")
        page.screenshot(path=str(out / "ui-chat-dark.png"))
        page.emulate_media(color_scheme="light")
        page.set_viewport_size({"width": 375, "height": 740})
        page.screenshot(path=str(out / "ui-chat-phone.png"))
        page.set_viewport_size({"width": 1200, "height": 800})
        page.goto(srv.url + "/dashboard?interval=500")

        def ask(_: int) -> int:
            return httpx.post(f"{srv.url}/v1/chat/completions", timeout=120, json={
                "max_tokens": 48, "messages": [{"role": "user", "content": "Name a prime number."}]}).status_code

        for _ in range(3):
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                assert list(pool.map(ask, range(3))) == [200] * 3
            page.wait_for_timeout(700)
        page.wait_for_function("window.ortDashboard.last.ttft.n >= 9")
        page.screenshot(path=str(out / "ui-dashboard.png"), full_page=True)
        assert w.errors == [] and w.outside() == []
    for name in ("ui-chat-light.png", "ui-chat-dark.png", "ui-dashboard.png"):
        assert png_size(out / name)[0] == 1200
    assert png_size(out / "ui-chat-phone.png") == (375, 740)
    light, dark = (out / "ui-chat-light.png").read_bytes(), (out / "ui-chat-dark.png").read_bytes()
    assert light != dark
