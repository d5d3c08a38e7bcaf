"""The dashboard in a real Chromium: charts fed by /ui/stats update without a reload."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import httpx
from servers import ServerThread

MSG = [{"role": "user", "content": "hi"}]


def test_dashboard_charts_update_live(srv: ServerThread, open_page: Any) -> None:
    w = open_page(srv.url, "/dashboard?interval=250")
    page = w.page
    page.wait_for_function("window.ortDashboard.polls >= 2")
    first = page.evaluate("window.ortDashboard.last.total_requests")
    points = page.evaluate("window.ortDashboard.charts['chart-tps'].data[0].length")

    def ask(model: str) -> int:
        # long enough (min_tokens) that 250 ms polls see them running, on a fast machine too
        length = {"max_tokens": 400, "min_tokens": 400} if model != "auto" else {"max_tokens": 64}
        r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=120,
                       json={"model": model, "messages": MSG, **length})
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # local ones run together: running > 1
        codes = list(pool.map(ask, ["tiny", "tiny", "tiny", "tiny", "auto"]))
    assert codes == [200] * 5
    page.wait_for_function(f"window.ortDashboard.last.total_requests >= {first + 4}")
    page.wait_for_function("window.ortDashboard.last.router.recent.length >= 1")
    dash = "window.ortDashboard.charts"
    assert page.evaluate(f"{dash}['chart-tps'].data[0].length") > points  # the same chart, more points
    assert page.evaluate(f"Math.max(...{dash}['chart-tps'].data[1])") > 0
    assert page.evaluate(f"Math.max(...{dash}['chart-ttft'].data[1].filter(x => x !== null))") > 0
    assert page.evaluate(f"Math.max(...{dash}['chart-tpot'].data[3].filter(x => x !== null))") > 0
    assert page.evaluate(f"Math.max(...{dash}['chart-load'].data[1])") >= 1
    assert page.evaluate(f"Math.min(...{dash}['chart-mem'].data[1])") > 10
    assert page.locator("#chart-tps canvas").count() == 1
    # four requests with one prompt: the later ones start from the first one's KV (prefix cache)
    page.wait_for_function("window.ortDashboard.last.prefix_cache.reused > 0")
    assert page.evaluate(f"Math.max(...{dash}['chart-cache'].data[1].filter(x => x !== null))") > 0
    assert "prefix cache hit rate" in page.inner_text("#tiles")
    decisions = page.inner_text("#decisions")
    assert "cloud:fake/hostile" in decisions
    assert "cloud" in page.inner_text("#costs")
    assert w.errors == [] and w.outside() == []
