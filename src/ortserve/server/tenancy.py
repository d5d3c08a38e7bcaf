"""Who a request is, what it may do, and which stored objects it sees (issue 45, docs/keys.md).

``Auth`` checks the key before any route runs (``GuardMiddleware``): ``ORTSERVE_API_KEY`` is an
admin that owns everything (as before keys files existed); each key of ``ORTSERVE_API_KEYS_FILE``
is its own tenant, named by its NAME. A ``user`` key is refused (403) on the routes that change
which models exist or are loaded. The routes then ask ``owner_of(request)``: None sees every
object, a name sees only the objects it created. Another tenant's object answers exactly the 404
of an object that does not exist, so a tenant cannot even learn that an id is taken.
"""

from __future__ import annotations

import hmac
import sqlite3
from typing import Any

from fastapi import Request

from ortserve.errors import NotFound, OrtServeError, Unauthorized
from ortserve.rag import owners
from ortserve.server.rag_access import locked, rag_of
from ortserve.tenants import ADMIN, Forbidden, KeyRing, Principal

PRINCIPAL = "ortserve.principal"          # the key in the ASGI scope
ROOT = Principal("admin", ADMIN, None)    # ORTSERVE_API_KEY, or a server without keys
# (method, path) that load, unload, import, pull, copy or delete models: admin keys only
ADMIN_ONLY = {("POST", "/v1/admin/load"), ("POST", "/v1/admin/unload"), ("POST", "/api/pull"),
              ("POST", "/api/create"), ("POST", "/api/copy"), ("DELETE", "/api/delete"), ("POST", "/api/push")}


class Auth:
    def __init__(self, settings: Any) -> None:
        self.key: str | None = settings.api_key
        self.ring = KeyRing(settings.api_keys_file) if settings.api_keys_file else None

    @property
    def enabled(self) -> bool:
        return bool(self.key) or self.ring is not None

    def principal(self, token: str) -> Principal | None:
        if self.key and hmac.compare_digest(token.encode(), self.key.encode()):
            return ROOT
        key = self.ring.lookup(token) if self.ring is not None and token else None
        return Principal(key.name, key.scope, key.name) if key is not None else None

    def check(self, scope: dict[str, Any], headers: dict[str, str]) -> OrtServeError | None:
        """None when the request may go on (its principal put in ``scope``), else the error to answer."""
        if not self.enabled:
            return None
        given = headers.get("authorization", "")
        # Anthropic's clients send the key as x-api-key; it counts like the bearer token
        token = given[7:] if given.lower().startswith("bearer ") else headers.get("x-api-key", "")
        try:
            who = self.principal(token)
        except OrtServeError as exc:   # a malformed key file: refuse every key until it is fixed
            return exc
        if who is None:
            return Unauthorized("missing or wrong API key (Authorization: Bearer ...)")
        if not who.is_admin and (scope.get("method", ""), scope.get("path", "")) in ADMIN_ONLY:
            return Forbidden(f"the key '{who.name}' has scope 'user'; loading, unloading, importing, pulling "
                             "and deleting models needs an 'admin' key")
        scope[PRINCIPAL] = who
        return None


def owner_of(request: Request) -> str | None:
    """The tenant whose objects this request sees; None: every object."""
    who = request.scope.get(PRINCIPAL)
    return who.owner if who is not None else None


# ---- files and vector stores (rag/owners.py: the owners table of the RAG store) ----------
def _missing(table: str, oid: str, param: str | None = None) -> NotFound:
    """The very 404 the RAG store answers for an id that does not exist."""
    if table == "files":
        return NotFound(f"No such file: {oid!r}", param=param or "file_id")
    return NotFound(f"No vector store found with id {oid!r}", param=param or "vector_store_id")


def check(con: sqlite3.Connection, who: str, table: str, oid: str, param: str | None = None) -> None:
    """404 (as for a missing id) unless ``who`` owns this object."""
    if owners.owner(con, table, oid) != who:
        raise _missing(table, oid, param)


async def own_file_path(request: Request) -> None:
    """Router dependency of /v1/files/{file_id}...: another tenant's file is a missing file."""
    await _own(request, "files", request.path_params.get("file_id"))


async def own_store_path(request: Request) -> None:
    """Router dependency of /v1/vector_stores/{vs_id}...: another tenant's store is a missing store."""
    await _own(request, "vector_stores", request.path_params.get("vs_id"))


async def own_files(request: Request, file_ids: list[str], param: str = "file_id") -> None:
    """Files a request body names (to add to a vector store) must be the requester's."""
    for fid in file_ids:
        await _own(request, "files", fid, param)


async def own_stores(request: Request, store_ids: list[str], param: str = "vector_store_ids") -> None:
    """Vector stores a request body names (file_search) must be the requester's."""
    for vid in store_ids:
        await _own(request, "vector_stores", vid, param)


async def _own(request: Request, table: str, oid: str | None, param: str | None = None) -> None:
    who = owner_of(request)
    if oid is not None and who is not None:
        await locked(check, rag_of(request).main, who, table, oid, param)


async def claimed(request: Request, table: str, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (just created) marked as the requester's, and returned."""
    who = owner_of(request)
    if who is not None:
        await locked(owners.claim, rag_of(request).main, table, obj["id"], who)
    return obj


async def mine(request: Request, table: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects of a list the requester sees."""
    who = owner_of(request)
    if who is None:
        return items
    ids = await locked(owners.owned, rag_of(request).main, table, who)
    return [x for x in items if x["id"] in ids]
