"""The web page's static files: chat (index.html), dashboard, and the vendored libraries.

Served by ortserve.server.api.ui; nothing here is fetched from the network at run time.
`vendor.py` re-vendors the libraries from npm (maintainers only).
"""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

UI_DIR = Path(__file__).resolve().parent
PAGES = {"/": "index.html", "/dashboard": "dashboard.html"}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".json": "application/json", ".svg": "image/svg+xml"}


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes
    media_type: str
    etag: str


def asset_files() -> dict[str, Path]:
    """Name (as in /ui/static/<name>) -> file: the page's own files and the vendored ones."""
    files = {p.name: p for p in UI_DIR.iterdir() if p.suffix in (".js", ".css", ".html", ".svg")}
    files.update({f"vendor/{p.name}": p for p in (UI_DIR / "vendor").iterdir() if p.suffix in (".js", ".css")})
    return files


def load_assets() -> dict[str, Asset]:
    """Every asset read and gzipped once (the page is < 300 KB; this keeps requests cheap)."""
    out = {}
    for name, path in asset_files().items():
        body = path.read_bytes()
        media = TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        out[name] = Asset(body, gzip.compress(body, 9, mtime=0), media,
                          '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
    return out
