"""Browser tests: a real headless Chromium (Debian's, installed here when missing and we are
root) driven by Playwright, against a real ortserve on 127.0.0.1 serving the tiny model.

The page's routed model ("auto") answers from a fake OpenAI-compatible cloud on 127.0.0.1
whose reply is hostile HTML: that is how the tests put `<script>` into model output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from router_fakes import FakeCloud
from servers import ServerThread

CHROMIUM = Path(os.environ.get("ORTSERVE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--disable-extensions", "--metrics-recording-only"]
HOSTILE = ('Look: <script>window.__xss = 1</script> and <img src=x onerror="window.__xss = 2"> '
           'and [link](javascript:window.__xss=3)')


def ensure_chromium() -> str | None:
    """Install Debian's chromium when it is missing (CI runs as root); a reason when impossible."""
    if CHROMIUM.exists():
        return None
    apt = shutil.which("apt-get")
    if apt is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return f"{CHROMIUM} is missing and cannot be installed here (needs root and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-q", "--no-install-recommends", "chromium"]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run([apt, "update", "-q"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"apt-get install chromium failed: {done.stderr.strip()[-300:]}"
    return None if CHROMIUM.exists() else f"chromium installed but {CHROMIUM} is absent"


# Module scope, not session: while sync_playwright() is open the main thread has a running event
# loop, and every later test that calls asyncio.run() would fail.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = ensure_chromium()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def cloud() -> Iterator[FakeCloud]:
    fake = FakeCloud("openai", reply=HOSTILE).start()
    yield fake
    fake.stop()


def router_config(home: Path, cloud: FakeCloud) -> Path:
    cfg = home / "route.json"
    cfg.write_text(json.dumps({
        "defaultProvider": "cloud", "fallbackChain": ["cloud"],
        "providers": {"local": {"type": "local"},
                      "cloud": {"type": "openai-compatible", "baseUrl": cloud.url, "apiKey": "sk-test-ui",
                                "models": {"default": "fake/hostile"}}}}), encoding="utf-8")
    return cfg


@pytest.fixture(scope="module")
def srv(tiny_model: Path, cloud: FakeCloud, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    home = tmp_path_factory.mktemp("ui-home")
    with ServerThread(tiny_model, home=str(home), router_config=str(router_config(home, cloud))) as s:
        yield s


@dataclass
class Watched:
    """A page and what it did: console errors, uncaught exceptions, every request's URL."""

    page: Any
    base: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def outside(self) -> list[str]:
        return [u for u in self.requests if not u.startswith((self.base + "/", "data:", "blob:"))]


def watch(context: Any, base: str) -> Watched:
    page = context.new_page()
    w = Watched(page, base)
    page.on("console", lambda m: w.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: w.errors.append(f"pageerror: {e}"))
    page.on("request", lambda r: w.requests.append(r.url))
    # a bound for a hang, not an expected speed: a transcription or a first token beside a CPU hog
    # (issue 45: the suite three times beside one busy process per core) takes minutes
    page.set_default_timeout(300_000)
    return w


# bypass_csp: the tests evaluate their own probes in the page; it also means the sanitiser is
# tested without the CSP's help (test_ui_http checks that the CSP header is there).
@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    contexts = []

    def _open(url: str, path: str = "/", *, width: int = 1200, height: int = 800,
              scheme: str = "light") -> Watched:
        ctx = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme,
                                  accept_downloads=True, bypass_csp=True)
        contexts.append(ctx)
        w = watch(ctx, url)
        w.page.goto(url + path)
        return w

    yield _open
    for ctx in contexts:
        ctx.close()
