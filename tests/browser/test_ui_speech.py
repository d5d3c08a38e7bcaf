"""Speech on the chat page, in a real Chromium: a WAV of espeak-ng speech uploaded from the page
is transcribed by the real Whisper-base (tests/conftest.py's session import) and shown as text
with its timed segments; a recording from Chromium's fake microphone goes to the server as a WAV
the page wrote itself, and comes back as a transcription (of a beep: the words are not checked)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS, ensure_chromium, watch
from servers import ServerThread
from tests.audio_material import speech_wav

from ortserve.audio.wer import wer

SAID = "The weather station reported heavy rain in the north. Please send two more boxes of batteries tomorrow."


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """conftest's Chromium with a fake microphone (a beep) that the page may use without asking."""
    reason = ensure_chromium()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    fake_mic = ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS + fake_mic)
        yield b
        b.close()


@pytest.fixture(scope="module")
def speech_srv(tiny_model: Path, whisper_base: Path) -> Iterator[ServerThread]:
    with ServerThread(tiny_model, home=str(whisper_base.parent.parent)) as s:
        yield s


def test_upload_a_wav_and_read_the_transcript(speech_srv: ServerThread, open_page: Any, tmp_path: Path) -> None:
    wav = tmp_path / "weather.wav"
    speech_wav(SAID, wav)
    w = open_page(speech_srv.url)
    page = w.page
    page.click("#speech summary")
    page.click("#speech-go")                                       # nothing chosen: told, nothing sent
    assert "Choose an audio file" in page.inner_text("#speech-status")
    page.set_input_files("#speech-file", str(wav))
    page.click("#speech-go")
    page.wait_for_selector("#segments li")   # the page's default bound (conftest.watch)
    text = page.inner_text("#transcript")
    assert wer([SAID], [text]) <= 0.1, text
    seg = page.inner_text("#segments li:first-child")
    assert re.match(r"0:00\.\d\d\u20130:0\d\.\d\d", seg), seg                 # start-end of the segment
    assert re.search(r"s of audio \(english\) in [\d.]+ s", page.inner_text("#speech-status"))
    page.click("#use-transcript")
    assert page.input_value("#prompt") == text
    assert not w.errors and not w.outside(), (w.errors, w.outside())
    # a file that is not audio: the server's 400, naming the field, shown in the page
    bad = tmp_path / "notes.wav"
    bad.write_text("not audio at all", encoding="utf-8")
    page.set_input_files("#speech-file", str(bad))
    page.click("#speech-go")
    page.wait_for_function("document.getElementById('speech-status').textContent.includes('[400]')")
    assert "(param: file)" in page.inner_text("#speech-status")
    assert page.inner_text("#transcript") == text                        # the last transcript stays
    assert [e for e in w.errors if "status of 400" not in e] == []       # the browser logs the 400 itself


def test_record_from_the_microphone(speech_srv: ServerThread, browser: Any) -> None:
    ctx = browser.new_context(permissions=["microphone"], bypass_csp=True)   # as open_page: the probes are eval
    try:
        w = watch(ctx, speech_srv.url)
        page = w.page
        page.goto(speech_srv.url + "/")
        page.click("#speech summary")
        page.click("#speech-record")
        page.wait_for_function("window.ortSpeech.recordedSeconds() > 1.0")   # samples arrived
        assert page.get_attribute("#speech-record", "aria-pressed") == "true"
        with page.expect_response(lambda r: r.url.endswith("/v1/audio/transcriptions")) as done:
            page.click("#speech-record")
        assert done.value.status == 200, done.value.text()
        page.wait_for_function("/s of audio/.test(document.getElementById('speech-status').textContent)")
        seconds = float(page.inner_text("#speech-status").split(" s of audio")[0])
        assert seconds >= 1.0                                         # the recording, as a WAV the server read
        assert page.get_attribute("#speech-record", "aria-pressed") == "false"
        assert not w.errors and not w.outside(), (w.errors, w.outside())
    finally:
        ctx.close()
