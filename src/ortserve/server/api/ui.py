"""The web page: chat at `/`, dashboard at `/dashboard`, assets under `/ui/static/`, and
`/ui/stats` (the dashboard's JSON). Off with ORTSERVE_UI=0.

With an API key set, the page's files are public (they hold no data; the page asks for the
key, keeps it in the browser's localStorage and sends it as a Bearer header); `/ui/stats` and
every API route still need the key.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ortserve.errors import NotFound
from ortserve.server.state import state_of
from ortserve.ui import PAGES, Asset, load_assets

router = APIRouter()
STATIC = "/ui/static/"
WINDOW_S = 300.0
# The page needs nothing but its own origin; inline script and event handlers never run, so even
# a sanitiser miss cannot execute model output, and no image in an answer can reach another host.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
_assets: dict[str, Asset] = {}


def is_public(path: str, method: str) -> bool:
    """The page's static files, which the API key does not guard (see module doc)."""
    return method in ("GET", "HEAD") and (path in PAGES or path.startswith(STATIC))


def _serve(request: Request, name: str) -> Response:
    if not _assets:
        _assets.update(load_assets())
    asset = _assets.get(name)
    if asset is None:
        raise NotFound(f"no such file: {name}", code="not_found")
    headers = {"ETag": asset.etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
               "Vary": "Accept-Encoding"}
    if name.endswith(".html"):
        headers.update({"Content-Security-Policy": CSP, "Referrer-Policy": "no-referrer"})
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    body = asset.body
    if "gzip" in request.headers.get("accept-encoding", ""):
        body, headers["Content-Encoding"] = asset.gzipped, "gzip"
    return Response(body, media_type=asset.media_type, headers=headers)


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def chat_page(request: Request) -> Response:
    return _serve(request, PAGES["/"])


@router.api_route("/dashboard", methods=["GET", "HEAD"], include_in_schema=False)
async def dashboard_page(request: Request) -> Response:
    return _serve(request, PAGES["/dashboard"])


@router.api_route(STATIC + "{name:path}", methods=["GET", "HEAD"], include_in_schema=False)
async def static_file(name: str, request: Request) -> Response:
    return _serve(request, name)


@router.get("/ui/stats")
async def stats(request: Request) -> JSONResponse:
    """One snapshot for the dashboard: load, latency percentiles, memory, routing and costs."""
    st = state_of(request)
    now = time.time()
    body: dict[str, Any] = {"time": round(now, 3), "uptime": round(now - st.started, 1),
                            "model": None, "running": 0, "waiting": 0, "tokens_per_second": 0.0,
                            "total_requests": 0, "total_output_tokens": 0}
    if st.engine is not None:
        s = st.engine.stats()
        body.update(model=st.engine.model_id, running=s.running, waiting=s.waiting,
                    tokens_per_second=round(s.tokens_per_second, 2), total_requests=s.total_requests,
                    total_output_tokens=s.total_output_tokens)
        body["prefix_cache"] = prefix_cache_view(s)
        proposed, accepted = int(s.speculative_proposed), int(s.speculative_accepted)
        body["speculative"] = {"proposed": proposed, "accepted": accepted,
                               "acceptance": round(accepted / proposed, 4) if proposed else None}
        draft = getattr(getattr(st.engine, "model", None), "draft", None)
        if draft is not None:  # of which a draft model's (docs/speculative.md)
            body["speculative"]["draft"] = {"model": draft.id,
                                            "proposed": int(s.speculative_draft_proposed),
                                            "accepted": int(s.speculative_draft_accepted)}
    if st.manager is not None:  # every loaded model, the pinned one included
        rows = st.manager.ps()
        body["models"] = rows
        body["running"] = sum(int(r.get("running") or 0) for r in rows) or body["running"]
        body["waiting"] = sum(int(r.get("waiting") or 0) for r in rows) or body["waiting"]
    recent = [r for r in list(st.metrics.recent) if now - r[0] <= WINDOW_S]
    body["window_s"] = WINDOW_S
    body["ttft"] = percentiles([r[1] for r in recent if r[1] is not None])
    body["tpot"] = percentiles([r[2] for r in recent if r[2] is not None])
    body["memory"] = memory()
    body["router"] = router_view(st.router)
    return JSONResponse(body)


def prefix_cache_view(s: Any) -> dict[str, Any]:
    """Prompt tokens computed and reused from the prefix cache, and the hit rate (reused / all)."""
    computed, reused = int(s.prompt_tokens_computed), int(s.prompt_tokens_reused)
    total = computed + reused
    return {"computed": computed, "reused": reused, "hit_rate": round(reused / total, 4) if total else None,
            "bytes": int(s.prefix_cache_bytes), "entries": int(s.prefix_cache_entries),
            "evictions": int(s.prefix_cache_evictions)}


def percentiles(values: list[float]) -> dict[str, Any]:
    """Nearest-rank p50/p90/p99 in milliseconds (None when nothing finished in the window)."""
    xs = sorted(values)
    if not xs:
        return {"n": 0, "p50": None, "p90": None, "p99": None}

    def rank(q: float) -> float:
        return round(xs[min(len(xs) - 1, max(0, int(q * len(xs) + 0.999999) - 1))] * 1000, 3)

    return {"n": len(xs), "p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99)}


def memory() -> dict[str, float]:
    vm = psutil.virtual_memory()
    rss = psutil.Process(os.getpid()).memory_info().rss
    return {"rss_mb": round(rss / 2**20, 1), "system_used_pct": vm.percent,
            "system_available_mb": round(vm.available / 2**20, 1)}


def router_view(rt: Any) -> dict[str, Any]:
    if rt is None:
        return {"providers": [], "costs": None, "recent": []}
    view: dict[str, Any] = {"providers": sorted(rt.providers), "costs": None, "recent": []}
    if rt.ledger is not None:
        view["costs"] = rt.ledger.report().to_dict()
        view["recent"] = rt.ledger.recent(20)
    return view
