"""A vision model as the pinned start model (issue 42): ``ortserve serve --model tiny-vl`` (the
random-weight Qwen2.5-VL of tests/conftest.py, in a real server process on 127.0.0.1) serves it as
its default model and loads no text engine. Requests with no model, a generic name, its store name
or its served id run on the vision engine, with images or without, through the real openai,
anthropic and ollama clients; /v1/models, /api/tags and /api/show list it as a vision model, the
page and its stats answer, and it stays pinned."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from tests.integration.test_vision import chat_messages, data_url, png

from ortserve.loopback import free_port, wait_healthy
from ortserve.models.store import Variant

pytest.importorskip("mobius")
SERVED = "tiny-vl:fp32-cpu"   # the store id serve resolves `tiny-vl` to: responses name the variant


@pytest.fixture(scope="module")
def url(tiny_vl: tuple[Path, Path, Variant], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("vl-serve") / "serve.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("ortserve")), "serve", "--model", "tiny-vl",
                                 "--port", str(port), "--log-level", "info"],
                                env={**os.environ, "ORTSERVE_HOME": str(tiny_vl[1])}, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            assert wait_healthy(base, 300, proc), log_path.read_text()
            yield base
        finally:
            proc.terminate()
            proc.wait(30)
    said = log_path.read_text()
    assert f"serving {SERVED} from" in said and "Traceback" not in said, said


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def test_the_vision_model_is_the_default_and_listed_as_vision(url: str, tiny_vl: tuple[Path, Path, Variant]) -> None:
    health = httpx.get(url + "/healthz", timeout=30).json()
    assert health["status"] == "ok" and health["model"] == SERVED
    data = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    assert data[0]["id"] == SERVED and data[0]["kind"] == "vision" and data[0]["pinned"] and data[0]["loaded"]
    assert [d["id"] for d in data].count(SERVED) == 1 and not any(d["id"] == "tiny-vl" for d in data)
    assert httpx.get(url + "/api/tags", timeout=30).json()["models"][0]["name"] == SERVED
    show = post(url, "/api/show", {"model": SERVED}).json()
    assert "vision" in show["capabilities"]
    ps = httpx.get(url + "/v1/admin/ps", timeout=30).json()["models"]
    assert [(r["model"], r["pinned"], r["state"]) for r in ps] == [(SERVED, True, "loaded")]   # no text engine
    assert Path(ps[0]["path"]).resolve() == tiny_vl[2].model_dir.resolve()   # type: ignore[attr-defined]


def test_no_model_or_any_of_its_names_runs_the_image_on_it(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    messages = chat_messages(png(seed=21))
    bare = post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0}).json()
    assert bare["model"] == SERVED and bare["usage"]["prompt_tokens"] > 6   # the image's tokens are in it
    for name in ("tiny-vl", SERVED, "default"):
        out = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0)
        assert out.model == SERVED and out.choices[0].message.content == bare["choices"][0]["message"]["content"]
    chunks = list(client.chat.completions.create(model="tiny-vl", messages=messages, max_tokens=6, temperature=0,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        bare["choices"][0]["message"]["content"]
    other = client.chat.completions.create(model=SERVED, messages=chat_messages(png(seed=22)), max_tokens=6,
                                           temperature=0)
    assert other.usage.prompt_tokens == bare["usage"]["prompt_tokens"]
    text = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3})
    assert text.status_code == 200 and text.json()["model"] == SERVED
    assert text.json()["usage"]["prompt_tokens"] < bare["usage"]["prompt_tokens"]
    bad = post(url, "/v1/chat/completions", {"messages": chat_messages(b"not an image"), "max_tokens": 2})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages.0.content.1.image_url.url"


def test_responses_messages_and_ollama_with_an_image(url: str) -> None:
    img = png(seed=23)
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    answer = client.responses.create(model="tiny-vl", max_output_tokens=4, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is in the image?"}, {"type": "input_image", "image_url": data_url(img)}]}])
    assert answer.model == SERVED and answer.usage.input_tokens > 6
    claude = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=120)
    msg = claude.messages.create(model=SERVED, max_tokens=4, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(img).decode()}},
        {"type": "text", "text": "What?"}]}])
    assert msg.model == SERVED and msg.usage.input_tokens > 6
    import ollama

    r = ollama.Client(host=url).chat(model=SERVED, options={"num_predict": 4}, messages=[
        {"role": "user", "content": "What is in this picture?", "images": [img]}])
    assert r.model == SERVED and r.prompt_eval_count > 6


def test_text_routes_run_on_it_and_it_stays_pinned(url: str) -> None:
    bare = post(url, "/v1/completions", {"prompt": "Once upon", "max_tokens": 3, "temperature": 0})
    named = post(url, "/v1/completions", {"model": "tiny-vl", "prompt": "Once upon", "max_tokens": 3, "temperature": 0})
    assert bare.status_code == named.status_code == 200, named.text
    assert bare.json()["choices"][0]["text"] == named.json()["choices"][0]["text"]
    assert post(url, "/tokenize", {"content": "Once upon"}).json()["count"] >= 1
    count = post(url, "/v1/messages/count_tokens", {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}]})
    assert count.status_code == 200 and count.json()["input_tokens"] > 1
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png()).decode()}}
    count = post(url, "/v1/messages/count_tokens", {"model": SERVED, "messages": [{"role": "user", "content": [image]}]})
    assert count.status_code == 400 and "counting the tokens of images" in count.json()["error"]["message"]
    assert count.json()["error"]["message"].startswith("'messages.0.content.0.source.data'")
    r = post(url, "/v1/admin/unload", {"model": SERVED})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_pinned"
    page = httpx.get(url + "/", timeout=30)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert httpx.get(url + "/ui/stats", timeout=30).json()["model"] == SERVED
    ps = httpx.get(url + "/v1/admin/ps", timeout=30).json()["models"]
    assert [(r["model"], r["pinned"]) for r in ps] == [(SERVED, True)]   # still the one engine, nothing else loaded
    assert ps[0]["requests"] >= 8


def test_serve_refuses_a_draft_model_beside_a_vision_start_model(tiny_vl: tuple[Path, Path, Variant]) -> None:
    """Speculation is off on vision rows: a --draft-model would be taken and ignored, so serve stops
    with a one-line error naming the option before loading anything."""
    from click.testing import CliRunner

    from ortserve.cli.main import cli

    res = CliRunner().invoke(cli, ["serve", "--model", "tiny-vl", "--draft-model", "default", "--port", "0"],
                             env={"ORTSERVE_HOME": str(tiny_vl[1])})
    assert res.exit_code == 1 and "--draft-model" in res.output and "vision model" in res.output, res.output
