"""OpenAI list pagination for the Files and Vector Stores routes: ``limit``, ``order``,
``after``, ``before``. A query parameter a route does not know is a 400 naming it, as in
the request bodies: nothing a client sends is silently ignored."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ortserve.errors import InvalidRequest

PAGING = ("limit", "order", "after", "before")


def page(request: Request, items: list[dict[str, Any]], *, default_limit: int = 20, max_limit: int = 100,
         known: tuple[str, ...] = ()) -> dict[str, Any]:
    """One page of ``items`` (any order) in the OpenAI list shape."""
    q = request.query_params
    for key in q:
        if key not in PAGING and key not in known:
            raise InvalidRequest(f"unknown query parameter {key!r} (this list takes "
                                 f"{', '.join(PAGING + known)})", param=key, code="unknown_parameter")
    limit = _limit(q.get("limit"), default_limit, max_limit)
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest(f"'order' must be 'asc' or 'desc', got {order!r}", param="order")
    items = sorted(items, key=lambda x: (x.get("created_at", 0), x["id"]), reverse=order == "desc")
    ids = [x["id"] for x in items]
    start, stop = 0, len(items)
    for param in ("after", "before"):
        cursor = q.get(param)
        if cursor is None:
            continue
        if cursor not in ids:
            raise InvalidRequest(f"'{param}' names no object in this list: {cursor!r}", param=param)
        if param == "after":
            start = ids.index(cursor) + 1
        else:
            stop = ids.index(cursor)
    window = items[start:stop]
    # with only `before`, the page is the last `limit` objects before the cursor
    data = window[-limit:] if q.get("before") is not None and q.get("after") is None else window[:limit]
    return {"object": "list", "data": data, "has_more": len(window) > len(data),
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def _limit(raw: str | None, default: int, most: int) -> int:
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {most}, got {raw!r}", param="limit")
    return int(raw)
