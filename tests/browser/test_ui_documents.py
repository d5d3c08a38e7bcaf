"""Document search on the chat page, in a real Chromium: a vector store made with the openai
client (the default embedding model), searched from the page, and a chat answered from it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from servers import ServerThread
from test_ui_chat import settings, wait_answered

DOCS = {
    "tea.txt": "Green tea is brewed with water at 80 degrees for two to three minutes; boiling water "
               "makes it bitter. <img src=x onerror=\"window.__xss = 7\"> Black tea takes boiling water.",
    "castle.txt": "The drawbridge of the castle is raised every evening at sunset by the gatekeeper.",
}


@pytest.fixture(scope="module")
def rag_srv(tiny_model: Path, embedding_model: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, str]]:
    with ServerThread(tiny_model, rag_dir=tmp_path_factory.mktemp("ui-rag")) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)
        vs = client.vector_stores.create(name="kitchen")
        d = tmp_path_factory.mktemp("ui-docs")
        for name, text in DOCS.items():
            (d / name).write_text(text, encoding="utf-8")
            f = client.vector_stores.files.upload_and_poll(vector_store_id=vs.id, file=(d / name).open("rb"))
            assert f.status == "completed", f.last_error
        yield srv, vs.id


def test_search_a_store_from_the_page(rag_srv: tuple[ServerThread, str], open_page: Any) -> None:
    srv, vs_id = rag_srv
    w = open_page(srv.url)
    page = w.page
    page.click("#documents summary")
    page.wait_for_selector(f"#store option[value='{vs_id}']", state="attached")
    assert page.inner_text(f"#store option[value='{vs_id}']") == "kitchen (2 files)"
    page.select_option("#store", vs_id)
    page.fill("#search-query", "how hot should the water be for green tea?")
    page.keyboard.press("Enter")
    page.wait_for_selector("#hits li")
    first = page.inner_text("#hits li:first-child")
    assert "tea.txt" in first and "80 degrees" in first and re.search(r"score [01]\.\d{3}", first), first
    # a document's markup is shown as text, never run
    assert '<img src=x onerror="window.__xss = 7">' in first
    assert page.eval_on_selector_all("#hits img, #hits [onerror]", "n => n.length") == 0
    assert page.evaluate("window.__xss") is None
    assert "hit" in page.inner_text("#search-status")
    # keyboard only: the query field is a search form, a second query replaces the hits
    page.focus("#search-query")
    page.keyboard.press("Control+A")
    page.keyboard.type("when is the drawbridge raised")
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelector('#hits li .hit-file').textContent === 'castle.txt'")
    assert w.errors == [] and w.outside() == []


def test_answer_from_store_shows_citations(rag_srv: tuple[ServerThread, str], open_page: Any) -> None:
    srv, vs_id = rag_srv
    w = open_page(srv.url)
    page = w.page
    page.wait_for_selector("#model option", state="attached")
    # the embedding model is served (for the stores) but is not offered for chat
    served = httpx.get(f"{srv.url}/v1/models", timeout=10).json()["data"]
    embedders = [m["id"] for m in served if m.get("kind") == "embedding"]
    assert embedders, served
    offered = page.eval_on_selector_all("#model option", "os => os.map(o => o.value)")
    assert "tiny" in offered and not set(embedders) & set(offered), offered
    page.click("#documents summary")
    page.wait_for_selector(f"#store option[value='{vs_id}']", state="attached")
    assert page.is_disabled("#use-store")  # no store chosen yet
    page.select_option("#store", vs_id)
    page.check("#use-store")
    settings(page, max_tokens=8)
    with page.expect_request("**/v1/chat/completions") as req:
        page.fill("#prompt", "How hot should the water be for green tea?")
        page.keyboard.press("Enter")
    assert req.value.post_data_json["file_search"] == {"vector_store_ids": [vs_id], "max_num_results": 4}
    wait_answered(page)
    sources = page.inner_text("#messages article.assistant details.citations")
    assert "tea.txt" in sources, sources
    # the choice is kept: after a reload the option is still on, and the citations are still shown
    page.reload()
    page.wait_for_selector(f"#store option[value='{vs_id}']", state="attached")
    assert page.input_value("#store") == vs_id and page.is_checked("#use-store")
    assert "tea.txt" in page.inner_text("#messages article.assistant details.citations")
    assert w.errors == [] and w.outside() == []
