"""The page over plain HTTP (no browser): assets, size, headers, the setting, the API key."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from servers import ServerThread

from ortserve.server.api.ui import percentiles

LIMIT = 300 * 1024


def page_assets(url: str, page: str) -> list[str]:
    html = httpx.get(url + page).text
    return [page] + re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', html)


def test_assets_gzip_small_and_safe(srv: ServerThread) -> None:
    total = 0
    seen = set()
    for page in ("/", "/dashboard"):
        for path in page_assets(srv.url, page):
            r = httpx.get(srv.url + path, headers={"Accept-Encoding": "gzip"})
            assert r.status_code == 200, path
            assert r.headers["content-encoding"] == "gzip"
            if path not in seen:
                total += int(r.headers["content-length"])
                seen.add(path)
            if path in ("/", "/dashboard"):
                csp = r.headers["content-security-policy"]
                assert "script-src 'self'" in csp and "connect-src 'self'" in csp
            again = httpx.get(srv.url + path, headers={"If-None-Match": r.headers["etag"]})
            assert again.status_code == 304
    assert len(seen) >= 12 and total < LIMIT, f"{len(seen)} files, {total} bytes gzipped"
    assert httpx.get(srv.url + "/ui/static/../../config.py").status_code == 404
    r = httpx.get(srv.url + "/ui/static/nope.js")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_stats_after_requests(srv: ServerThread) -> None:
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60,
                   json={"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    s = httpx.get(srv.url + "/ui/stats").json()
    assert s["model"] == "tiny" and s["running"] == 0 and s["total_requests"] >= 1
    assert s["ttft"]["n"] >= 1 and s["ttft"]["p50"] > 0 and s["tpot"]["p99"] >= s["tpot"]["p50"] > 0
    assert s["memory"]["rss_mb"] > 10
    assert s["router"]["providers"] == ["cloud", "local"]


def test_ui_off_and_api_key(tiny_model: Path) -> None:
    with ServerThread(tiny_model, ui=False) as s:
        assert httpx.get(s.url + "/").status_code == 404
        assert httpx.get(s.url + "/ui/stats").status_code == 404
    with ServerThread(tiny_model, api_key="s3cret") as s:
        assert httpx.get(s.url + "/").status_code == 200  # the page itself holds no data
        assert httpx.get(s.url + "/ui/static/chat.js").status_code == 200
        r = httpx.get(s.url + "/ui/stats")
        assert r.status_code == 401 and r.json()["error"]["type"]
        assert httpx.get(s.url + "/ui/stats", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.post(s.url + "/", json={}).status_code in (401, 405)


def test_percentiles_nearest_rank() -> None:
    assert percentiles([]) == {"n": 0, "p50": None, "p90": None, "p99": None}
    xs = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert percentiles(xs) == {"n": 100, "p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert percentiles([0.2]) == {"n": 1, "p50": 200.0, "p90": 200.0, "p99": 200.0}
