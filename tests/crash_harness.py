"""Kill -9 at a named point, restart, check: the crash-safety harness (issue 45).

A real ``ortserve serve`` (or ``ortserve models import-adapter``) subprocess runs with
``ORTSERVE_CRASH_AT=<point>[:n]`` (src/ortserve/faults.py): the n-th time a write path reaches the
point it prints ``ortserve: crash point <point> #<n>`` and SIGKILLs itself, so the harness knows
exactly where it died. A restarted server (unarmed, or armed for the next kill) must then show
every store entry complete or absent, every acknowledged write present, every file added to a
vector store searchable or failed with a reason, no SQLite database corrupt and no temp file left.
``check`` returns the inconsistencies it found as sentences (none: an empty list).

Used by tests/integration/test_crash_safety.py (a handful of points) and benchmarks/kill_campaign.py
(seeded random points, 50+ kills).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ortserve.loopback import free_port, wait_healthy

SETTLE_S = 180.0       # how long a check waits for resumed ingestion to finish (a deadline, not a timing claim)
SERVER_POINTS = {
    "upload": ["rag.upload.partial", "rag.upload.written", "rag.upload.row", "rag.upload.committed"],
    "ingest": ["rag.enqueued", "rag.ingest.embedded", "rag.ingest.commit"],
    "responses": ["responses.commit"],
    "ledger": ["ledger.commit"],
}
IMPORT_POINTS = {
    "gguf": ["gguf.begun", "gguf.written", "store.installed"],   # store.build/manifest: by the lora rounds
    "lora": ["adapter.written", "store.build", "store.manifest", "store.swap", "store.installed"],
}


class ServerDied(Exception):
    """The server went away (killed at its armed point) while the harness was talking to it."""


@dataclass
class Material:
    """What the harness serves and imports: a chat model directory, a small GGUF file, a PEFT
    adapter of the chat model, and the store directories of the embedding model."""

    model_dir: Path
    gguf: Path
    adapter: Path
    embedding_variants: list[Path]


@dataclass
class Expect:
    """Writes a client saw acknowledged (a 200 before the kill): each must survive it."""

    files: dict[str, str] = field(default_factory=dict)          # file id -> sha256
    vs_files: dict[tuple[str, str], str] = field(default_factory=dict)   # (vs id, file id) -> its tag word
    responses: dict[str, Any] = field(default_factory=dict)      # response id -> the object returned
    routed: int = 0                                              # chats answered through the router
    tags: int = 0

    def tag(self) -> str:
        self.tags += 1
        return f"zq{uuid.uuid4().hex[:6]}x{self.tags}"


def prepare_home(home: Path, material: Material) -> None:
    """A fresh ORTSERVE_HOME: the embedding model linked in (symlinks, so a small disk holds it),
    the chat model installed as a linked variant ``tiny`` (the LoRA imports' base)."""
    from ortserve.models.store import ModelStore

    models = home / "models"
    models.mkdir(parents=True, exist_ok=True)
    for v in material.embedding_variants:
        link = models / v.name
        if not link.exists():
            link.symlink_to(v, target_is_directory=True)
    store = ModelStore(models)
    if not store.find("tiny"):
        store.install("tiny", "fp32-cpu", lambda _tmp: {"precision": "fp32", "device": "cpu",
                                                        "link": str(material.model_dir)})


def _env(home: Path, crash_at: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ORTSERVE_CRASH_AT"}
    env.update(ORTSERVE_HOME=str(home), HF_HUB_OFFLINE="1", ORTSERVE_KEEP_ALIVE="-1")
    if crash_at:
        env["ORTSERVE_CRASH_AT"] = crash_at
    return env


def _ortserve() -> str:
    return str(Path(sys.executable).with_name("ortserve"))


class Server:
    """``ortserve serve`` as a subprocess on a loopback port, its output in ``log``."""

    def __init__(self, home: Path, model: Path, log: Path, crash_at: str | None = None) -> None:
        self.home, self.log_path, self.crash_at = home, log, crash_at
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("ab")
        self.proc = subprocess.Popen([_ortserve(), "serve", "--model", str(model), "--port", str(self.port),
                                      "--log-level", "warning"], env=_env(home, crash_at),
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=120)

    def wait_ready(self, timeout: float = 300.0) -> bool:
        return wait_healthy(self.url, timeout, self.proc)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self.client.request(method, path, **kw)
        except httpx.TransportError as exc:
            if self.proc.poll() is not None or _dies(self.proc):
                raise ServerDied(path) from exc
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)
        self.close()

    def close(self) -> None:
        self.client.close()
        self._log.close()

    def crash_line(self) -> str | None:
        """The point it died at, as faults.point printed it (None: it did not die at one)."""
        return crash_line(self.log_path)


def _dies(proc: subprocess.Popen[bytes], grace: float = 10.0) -> bool:
    try:
        proc.wait(grace)
        return True
    except subprocess.TimeoutExpired:
        return False


def crash_line(log: Path) -> str | None:
    lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.startswith("ortserve: crash point ")]
    return lines[-1].removeprefix("ortserve: crash point ") if lines else None


# ---- workloads: each makes writes that reach its scenario's points --------------------------------
def _doc(tag: str) -> bytes:
    body = "\n\n".join(f"Section {i}. The {tag} record keeps notes on item {i}, with filler words "
                       f"about weather, rivers and old maps, entry {i}." for i in range(6))
    return f"# Notes {tag}\n\n{body}\n".encode()


def upload(srv: Server, ex: Expect, n: int = 3) -> list[str]:
    ids = []
    for _ in range(n):
        tag = ex.tag()
        data = _doc(tag)
        r = srv.call("POST", "/v1/files", files={"file": (f"{tag}.md", data)}, data={"purpose": "assistants"})
        r.raise_for_status()
        ex.files[r.json()["id"]] = hashlib.sha256(data).hexdigest()
        ids.append(r.json()["id"])
    return ids


def ingest(srv: Server, ex: Expect, n: int = 2) -> None:
    r = srv.call("POST", "/v1/vector_stores", json={"name": f"vs-{ex.tag()}"})
    r.raise_for_status()
    vid = r.json()["id"]
    before = set(ex.files)
    for fid in upload(srv, ex, n):
        r = srv.call("POST", f"/v1/vector_stores/{vid}/files", json={"file_id": fid})
        r.raise_for_status()
        ex.vs_files[(vid, fid)] = ""
    new = [f for f in ex.files if f not in before]
    for fid in new:
        settled(srv, vid, fid)


def settled(srv: Server, vid: str, fid: str, timeout: float = SETTLE_S) -> dict[str, Any]:
    """The vector-store file once it is no longer in_progress (resumed work included)."""
    deadline = time.monotonic() + timeout
    while True:
        r = srv.call("GET", f"/v1/vector_stores/{vid}/files/{fid}")
        r.raise_for_status()
        f: dict[str, Any] = r.json()
        if f["status"] != "in_progress" or time.monotonic() > deadline:
            return f
        time.sleep(0.1)


def respond(srv: Server, ex: Expect, n: int = 2) -> None:
    for _ in range(n):
        r = srv.call("POST", "/v1/responses", json={"model": model_of(srv), "input": f"Say {ex.tag()}",
                                                    "store": True, "max_output_tokens": 4})
        r.raise_for_status()
        ex.responses[r.json()["id"]] = r.json()


def routed_chat(srv: Server, ex: Expect, n: int = 2) -> None:
    for _ in range(n):
        r = srv.call("POST", "/v1/chat/completions", json={"model": "auto", "max_tokens": 3,
                                                           "messages": [{"role": "user", "content": "Hi"}]})
        r.raise_for_status()
        ex.routed += 1


def model_of(srv: Server) -> str:
    return str(srv.call("GET", "/v1/models").json()["data"][0]["id"])


WORKLOADS = {"upload": upload, "ingest": ingest, "responses": respond, "ledger": routed_chat}


def import_adapter(home: Path, material: Material, log: Path, crash_at: str | None) -> subprocess.CompletedProcess[bytes]:
    with log.open("ab") as out:
        return subprocess.run([_ortserve(), "models", "import-adapter", str(material.adapter), "--base", "tiny",
                               "--id", "my-adapter"], env=_env(home, crash_at), stdout=out, stderr=subprocess.STDOUT,
                              timeout=600, check=False)


def import_gguf(home: Path, material: Material, log: Path, crash_at: str | None, name: str | None = None) -> int:
    """``ortserve serve --model FILE.gguf`` imports the file before serving it: killed during the import.
    ``name``: the file copied under that name first (a new model id, so it is imported again)."""
    gguf = material.gguf
    if name is not None:
        gguf = log.parent / name
        shutil.copyfile(material.gguf, gguf)
    srv = Server(home, gguf, log, crash_at)
    if srv.wait_ready(900):   # it imported and serves (the point was not reached): stop it
        srv.kill()
        return 0
    srv.kill()
    return srv.proc.returncode


# ---- the check ---------------------------------------------------------------------------------------
def check(home: Path, srv: Server | None, ex: Expect) -> list[str]:
    """Every inconsistency under ``home`` (and, with a running ``srv``, in what it serves)."""
    issues = sqlite_issues(home) + model_store_issues(home) + rag_file_issues(home)
    if srv is not None:
        issues += served_issues(srv, home, ex)
    return issues


def sqlite_issues(home: Path) -> list[str]:
    out = []
    for db in sorted(home.rglob("*.sqlite")):
        if any(p.is_symlink() for p in db.relative_to(home).parents if p != Path()):
            continue
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            res = [r[0] for r in con.execute("PRAGMA integrity_check")]
        except sqlite3.DatabaseError as exc:
            res = [str(exc)]
        finally:
            con.close()
        if res != ["ok"]:
            out.append(f"{db.relative_to(home)}: integrity_check {res[:3]}")
    return out


def model_store_issues(home: Path) -> list[str]:
    from ortserve.models.store import MANIFEST, ModelStore, Variant

    root, out = home / "models", []
    if not root.is_dir():
        return out
    store = ModelStore(root)
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or d.is_symlink():
            continue
        try:
            v = Variant.from_json(json.loads((d / MANIFEST).read_text(encoding="utf-8")), d)
        except (OSError, ValueError, TypeError) as exc:
            out.append(f"models/{d.name}: no readable manifest ({type(exc).__name__})")
            continue
        bad = {k: f for k, f in store.verify(v).items() if f}
        if bad:
            out.append(f"models/{d.name}: {bad}")
        out += [f"models/{d.name}/{p.name}: manifest temp file left" for p in d.glob(f".{MANIFEST}.*")]
    if (root / ".tmp").is_dir():
        out += [f"models/.tmp/{p.name}: temp left behind" for p in (root / ".tmp").iterdir()]
    return out


def rag_file_issues(home: Path) -> list[str]:
    rag, out = home / "rag", []
    if not (rag / "rag.sqlite").is_file():
        return out
    con = sqlite3.connect(f"file:{rag / 'rag.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        rows = {r[0]: (r[1], r[2]) for r in con.execute("SELECT id, bytes, sha256 FROM files")}
        stores = [r[0] for r in con.execute("SELECT id FROM vector_stores")]
    finally:
        con.close()
    for fid, (size, sha) in rows.items():
        p = rag / "files" / fid
        if not p.is_file():
            out.append(f"file {fid}: row without bytes")
        elif p.stat().st_size != size or hashlib.sha256(p.read_bytes()).hexdigest() != sha:
            out.append(f"file {fid}: bytes differ from its row")
    for p in (rag / "files").iterdir():
        if p.name not in rows:
            out.append(f"rag/files/{p.name}: {'temp file' if p.name.startswith('.') else 'bytes without a row'}")
    for vid in stores:
        if not (rag / "stores" / f"{vid}.sqlite").is_file():
            out.append(f"vector store {vid}: registered but its database is missing")
    return out


def served_issues(srv: Server, home: Path, ex: Expect) -> list[str]:
    out = []
    for fid, sha in ex.files.items():
        r = srv.call("GET", f"/v1/files/{fid}/content")
        if r.status_code != 200 or hashlib.sha256(r.content).hexdigest() != sha:
            out.append(f"acknowledged file {fid}: {r.status_code} or different bytes after the restart")
    for rid, obj in ex.responses.items():
        r = srv.call("GET", f"/v1/responses/{rid}")
        if r.status_code != 200 or r.json() != obj:
            out.append(f"acknowledged response {rid}: {r.status_code} after the restart")
    out += _stored_responses(srv, home)
    out += _vector_stores(srv, ex)
    if ex.routed:
        con = sqlite3.connect(f"file:{home / 'costs.sqlite'}?mode=ro", uri=True, timeout=30)
        try:
            rows = con.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        finally:
            con.close()
        if rows < ex.routed:
            out.append(f"cost ledger: {rows} rows for {ex.routed} acknowledged routed chats")
    return out


def _stored_responses(srv: Server, home: Path) -> list[str]:
    db = home / "responses.sqlite"
    if not db.is_file():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:   # a first write on a full disk may have left the file without its table: no rows then
        has = con.execute("SELECT 1 FROM sqlite_master WHERE name='responses'").fetchone()
        ids = [r[0] for r in con.execute("SELECT id FROM responses")] if has else []
    finally:
        con.close()
    out = []
    for rid in ids:       # every row (acknowledged or not) is whole: it parses and is served
        r = srv.call("GET", f"/v1/responses/{rid}")
        if r.status_code != 200 or r.json().get("id") != rid or "output" not in r.json():
            out.append(f"stored response {rid}: not served whole ({r.status_code})")
    return out


def _vector_stores(srv: Server, ex: Expect) -> list[str]:
    out = []
    stores = srv.call("GET", "/v1/vector_stores", params={"limit": 100}).json()["data"]
    have = {s["id"] for s in stores}
    out += [f"acknowledged vector store file {k}: its store is gone" for k in ex.vs_files if k[0] not in have]
    for s in stores:
        files = srv.call("GET", f"/v1/vector_stores/{s['id']}/files", params={"limit": 100}).json()["data"]
        listed = {f["id"] for f in files}
        out += [f"acknowledged vector store file {fid} in {vid}: missing after the restart"
                for (vid, fid) in ex.vs_files if vid == s["id"] and fid not in listed]
        for f in files:
            f = settled(srv, s["id"], f["id"])
            if f["status"] == "in_progress":
                out.append(f"{s['id']}/{f['id']}: still in_progress {SETTLE_S:.0f}s after the restart (not resumed)")
            elif f["status"] == "failed" and not (f.get("last_error") or {}).get("message"):
                out.append(f"{s['id']}/{f['id']}: failed without a reason")
            elif f["status"] == "completed" and not _searchable(srv, s["id"], f):
                out.append(f"{s['id']}/{f['id']}: completed but its words are not found")
    return out


def _searchable(srv: Server, vid: str, f: dict[str, Any]) -> bool:
    tag = f["filename"].removesuffix(".md")
    r = srv.call("POST", f"/v1/vector_stores/{vid}/search",
                 json={"query": tag, "search_mode": "bm25", "max_num_results": 5})
    return r.status_code == 200 and any(h["file_id"] == f["id"] for h in r.json()["data"])
