"""Open WebUI against ortserve as its Ollama connection, in a real browser (issue 44).

Open WebUI (PyPI ``open-webui``) is too large for the suite (a separate venv of ~2 GB with its own
torch), so this script is the end-to-end check, run by hand:

    python3 -m venv ~/.cache/owui && ~/.cache/owui/bin/pip install open-webui
    .venv/bin/python benchmarks/open_webui_e2e.py --open-webui ~/.cache/owui/bin/open-webui

It starts ``ortserve serve`` and Open WebUI (offline, no login, ``OLLAMA_BASE_URL`` set to ortserve)
on free ports of 127.0.0.1, opens the page in Debian's Chromium (playwright), checks that the model
picker shows ortserve's model, sends a message and waits for the streamed answer. It prints JSON
(what was seen, which ortserve routes Open WebUI called) and leaves screenshots in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if httpx.get(url, timeout=5).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"{url} did not answer within {seconds:.0f} s")


def drive(url: str, model: str, prompt: str, out: Path, wait_s: float) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                    args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url, wait_until="load", timeout=120_000)
        page.wait_for_timeout(5000)
        if page.get_by_text("Okay, Let's Go!").count():  # the release notes, on a first visit
            page.get_by_text("Okay, Let's Go!").click()
        page.get_by_text(model).first.wait_for(timeout=60_000)  # the picker lists ortserve's model
        page.screenshot(path=str(out / "open_webui_models.png"))
        page.locator("#chat-input").click()
        page.keyboard.type(prompt)
        page.keyboard.press("Enter")
        answer, end = "", time.monotonic() + wait_s
        while time.monotonic() < end and not answer.strip():
            page.wait_for_timeout(1000)
            texts = page.locator("#response-content-container").all_inner_texts()
            answer = texts[-1] if texts else ""
        page.wait_for_timeout(5000)  # the rest of the stream
        texts = page.locator("#response-content-container").all_inner_texts()
        answer = texts[-1] if texts else answer
        page.screenshot(path=str(out / "open_webui_answer.png"))
        browser.close()
    return {"model_listed": True, "answer_chars": len(answer.strip()), "answer_head": answer.strip()[:120]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--open-webui", required=True, help="the open-webui executable of its own venv")
    ap.add_argument("--model", default="smollm2-135m", help="the store model to serve (its name as /api/tags lists it)")
    ap.add_argument("--prompt", default="Name three colours.")
    ap.add_argument("--out", type=Path, default=Path("open-webui-e2e"))
    ap.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the answer's first text")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ort_port, ui_port = free_port(), free_port()
    work = Path(tempfile.mkdtemp(prefix="owui-e2e-"))
    ort_log = (work / "ortserve.log").open("w", encoding="utf-8")
    ui_log = (work / "open-webui.log").open("w", encoding="utf-8")
    ortserve = subprocess.Popen([sys.executable, "-m", "ortserve.cli.main", "serve", "--host", "127.0.0.1",
                                 "--port", str(ort_port), "--model", args.model], stdout=ort_log, stderr=subprocess.STDOUT)
    env = {**os.environ, "OLLAMA_BASE_URL": f"http://127.0.0.1:{ort_port}", "ENABLE_OPENAI_API": "False",
           "WEBUI_AUTH": "False", "DATA_DIR": str(work / "data"), "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1",
           "RAG_EMBEDDING_MODEL_AUTO_UPDATE": "False", "ENABLE_VERSION_UPDATE_CHECK": "False",
           "WEBUI_SECRET_KEY": "e2e"}
    ui = subprocess.Popen([args.open_webui, "serve", "--host", "127.0.0.1", "--port", str(ui_port)],
                          stdout=ui_log, stderr=subprocess.STDOUT, env=env, cwd=work)
    started = time.monotonic()
    try:
        wait_http(f"http://127.0.0.1:{ort_port}/healthz", 600)
        tags = httpx.get(f"http://127.0.0.1:{ort_port}/api/tags", timeout=30).json()["models"]
        listed = next(m["name"] for m in tags if m["name"].split(":")[0] == args.model.split(":")[0])
        wait_http(f"http://127.0.0.1:{ui_port}/health", 600)
        seen = drive(f"http://127.0.0.1:{ui_port}/", listed, args.prompt, args.out, args.wait)
    finally:
        for proc in (ui, ortserve):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        ort_log.close()
        ui_log.close()
    routes = re.findall(r'"(GET|POST) (/api/[a-z]+)', (work / "ortserve.log").read_text(encoding="utf-8"))
    print(json.dumps({"model": listed, **seen, "ortserve_routes_called": sorted({f"{m} {p}" for m, p in routes}),
                      "seconds": round(time.monotonic() - started, 1),
                      "screenshots": [str(args.out / n) for n in ("open_webui_models.png", "open_webui_answer.png")]},
                     indent=2))
    if not seen["answer_chars"]:
        raise SystemExit("Open WebUI showed no answer")


if __name__ == "__main__":
    main()
