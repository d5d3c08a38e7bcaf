"""file:// images (issue 42) under the folder the operator configures (ORTSERVE_IMAGE_DIR), on the
random-weight Qwen2.5-VL of tests/conftest.py: the same answer as the image sent inline, through the
real openai (chat, Responses) and anthropic (a url source) clients; a path outside the folder (by
'..', by an absolute path, or through a symlink), a missing file, a directory, a FIFO, another host,
an image over the byte or pixel limit are 400s naming the field; with no folder set, file:// is a
400 that says how to allow it."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from tests.integration.test_vision import MODEL, data_url, png, png_bomb
from tests.servers import ServerThread

from ortserve.models.store import Variant

pytest.importorskip("mobius")
FIELD = "messages.0.content.1.image_url.url"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image folder: a few images, a sub-folder, a symlink inside it and one out of it, a FIFO;
    beside it a file that must never be served."""
    base = tmp_path_factory.mktemp("file-urls")
    root = base / "images"
    (root / "sub").mkdir(parents=True)
    (root / "cat.png").write_bytes(png(seed=11))
    (root / "sub" / "my dog.png").write_bytes(png(70, 42, seed=12))
    (root / "big.png").write_bytes(png(400, 300))            # over the server's 100000 bytes
    (root / "wide.png").write_bytes(png_bomb(5000))          # 25 M pixels in a few kB, over 20 M
    (root / "alias.png").symlink_to(root / "cat.png")        # a symlink that stays inside: served
    (base / "secret.png").write_bytes(png(seed=13))
    (root / "escape.png").symlink_to(base / "secret.png")    # a symlink out of the folder: refused
    os.mkfifo(root / "pipe.png")                            # opening it for reading would block
    return root


@pytest.fixture(scope="module")
def srv(tiny_model: Path, tiny_vl: tuple[Path, Path, Variant], folder: Path):
    """The folder configured through a symlink to it: URLs through the link and through the real path
    both name files under it."""
    link = folder.parent / "images-link"
    link.symlink_to(folder)
    with ServerThread(tiny_model, home=str(tiny_vl[1]), image_dir=str(link), image_max_bytes=100_000,
                      image_max_pixels=20_000_000) as s:
        yield s


def chat(srv: ServerThread, url: str) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in the image?"}, {"type": "image_url", "image_url": {"url": url}}]}]})


def test_a_file_url_answers_as_the_same_image_inline_on_every_api(srv: ServerThread, folder: Path) -> None:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    cat = (folder / "cat.png").read_bytes()

    def ask(url: str) -> Any:
        return client.chat.completions.create(model=MODEL, max_tokens=6, temperature=0, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is in the image?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}])

    inline = ask(data_url(cat))
    encoder = srv.state.vision.engine(MODEL).encoder
    runs = encoder.runs
    via_file = ask((folder / "cat.png").as_uri())
    assert via_file.choices[0].message.content == inline.choices[0].message.content
    assert via_file.usage.prompt_tokens == inline.usage.prompt_tokens
    assert encoder.runs == runs    # the same bytes, the same sha256: the features come from the cache
    via_link = ask((folder.parent / "images-link" / "alias.png").as_uri())   # configured link, inner symlink
    assert via_link.choices[0].message.content == inline.choices[0].message.content
    dog = (folder / "sub" / "my dog.png")
    assert "%20" in dog.as_uri()   # percent-escaped names are read as the file's name
    spaced = ask("file://localhost" + dog.as_uri().removeprefix("file://"))
    assert spaced.choices[0].message.content == ask(data_url(dog.read_bytes())).choices[0].message.content

    def respond(url: str) -> str:
        return client.responses.create(model=MODEL, max_output_tokens=6, temperature=0, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "What is in the image?"},
                                         {"type": "input_image", "image_url": url}]}]).output_text

    assert respond((folder / "cat.png").as_uri()) == respond(data_url(cat))

    claude = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=120)

    def message(source: dict[str, Any]) -> str:
        out = claude.messages.create(model=MODEL, max_tokens=6, extra_body={"temperature": 0}, messages=[
            {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "What?"}]}])
        return "".join(b.text for b in out.content if b.type == "text")

    assert message({"type": "url", "url": (folder / "cat.png").as_uri()}) == message(
        {"type": "base64", "media_type": "image/png", "data": base64.b64encode(cat).decode()})


@pytest.mark.parametrize(("name", "says"), [
    ("{root}/../secret.png", "'..'"),
    ("{root}/sub/%2e%2e/../secret.png", "'..'"),              # escaped dots are dots
    ("/etc/passwd", "outside the server's image folder"),
    ("{base}/secret.png", "outside the server's image folder"),
    ("{root}/escape.png", "outside the server's image folder"),  # a symlink that points out
    ("{root}/missing.png", "names no file"),
    ("{root}/sub", "not a regular file"),
    ("{root}/pipe.png", "not a regular file"),
    ("{root}/big.png", "above this server's limit of 100000 bytes"),
    ("{root}/wide.png", "5000x5000 = 25000000 pixels, above this server's limit of 20000000"),
])
def test_files_outside_the_folder_or_over_the_limits_are_400s(srv: ServerThread, folder: Path, name: str,
                                                             says: str) -> None:
    path = name.format(root=folder, base=folder.parent)
    r = chat(srv, "file://" + path)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == FIELD and says in err["message"], err
    assert str(folder) not in err["message"]   # the folder's own path is not told to clients
    assert chat(srv, (folder / "cat.png").as_uri()).status_code == 200   # and the server keeps serving


@pytest.mark.parametrize(("url", "says"), [
    ("file://example.com/cat.png", "names the host 'example.com'"),
    ("file:cat.png", "file:///absolute/path"),
    ("file:///cat.png?x=1", "no query"),
])
def test_malformed_file_urls_are_400s(srv: ServerThread, url: str, says: str) -> None:
    r = chat(srv, url)
    assert r.status_code == 400 and r.json()["error"]["param"] == FIELD and says in r.json()["error"]["message"]


def test_file_urls_with_no_folder_set_say_how_to_allow_them(tiny_model: Path, tiny_vl: tuple[Path, Path, Variant],
                                                            folder: Path) -> None:
    url = (folder / "cat.png").as_uri()
    with ServerThread(tiny_model, home=str(tiny_vl[1])) as s:
        r = chat(s, url)
        assert r.status_code == 400 and r.json()["error"]["param"] == FIELD
        assert "ORTSERVE_IMAGE_DIR" in r.json()["error"]["message"] and "--image-dir" in r.json()["error"]["message"]
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model=MODEL, input=[{"role": "user", "content": [
                {"type": "input_text", "text": "What?"}, {"type": "input_image", "image_url": url}]}])
        assert err.value.body["param"] == "input.0.content.1.image_url" and "ORTSERVE_IMAGE_DIR" in err.value.message
        claude = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0, timeout=120)
        with pytest.raises(anthropic.BadRequestError) as aerr:
            claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": url}}, {"type": "text", "text": "What?"}]}])
        assert aerr.value.body["error"]["message"].startswith("'messages.0.content.0.source.url' is a file:// URL")
        assert not s.state.vision.loaded()   # refused before the model was needed


def test_serve_refuses_an_image_folder_that_is_not_one(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ortserve.cli.main import cli

    res = CliRunner().invoke(cli, ["serve", "--image-dir", str(tmp_path / "nowhere"), "--port", "0"],
                             env={"ORTSERVE_HOME": str(tmp_path / "home")})
    assert res.exit_code == 1 and "is not a directory" in res.output and "--image-dir" in res.output, res.output
