"""The key file: one key a line, ``NAME KEY SCOPE``.

KEY is the key itself or ``sha256:`` and the hex SHA-256 of it; SCOPE is ``admin`` or ``user``;
``#`` starts a comment, blank lines are skipped. ``ortserve keys add`` writes only the hash. A
request's key is hashed and compared with every entry's hash by ``hmac.compare_digest`` (constant
time, no early exit), and the file is re-read when its mtime or size changes, so a revoke takes
effect on the next request without a restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from ortserve.errors import InvalidRequest, OrtServeError

ADMIN, USER = "admin", "user"
SCOPES = (ADMIN, USER)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")


class Forbidden(OrtServeError):
    status = 403
    type = "permission_error"
    code = "insufficient_scope"


class KeyFileError(OrtServeError):
    status = 500
    type = "server_error"
    code = "key_file_invalid"


@dataclass(frozen=True)
class Key:
    name: str
    digest: str        # hex SHA-256 of the key
    scope: str


@dataclass(frozen=True)
class Principal:
    """Who sent a request. ``owner`` is the tenant whose objects it sees; None sees every object
    (no keys configured, or the one ``ORTSERVE_API_KEY``: an admin owning everything, as before)."""
    name: str
    scope: str
    owner: str | None

    @property
    def is_admin(self) -> bool:
        return self.scope == ADMIN


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse_line(line: str, where: str) -> Key | None:
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    parts = text.split()
    if len(parts) != 3:
        raise KeyFileError(f"{where}: expected 'NAME KEY SCOPE', got {len(parts)} field(s)")
    name, key, scope = parts
    if not _NAME.match(name):
        raise KeyFileError(f"{where}: the name {name!r} is not letters, digits, '.', '_' or '-'")
    if scope not in SCOPES:
        raise KeyFileError(f"{where}: the scope {scope!r} is not one of {', '.join(SCOPES)}")
    if key.startswith("sha256:"):
        digest = key[7:].lower()
        if not _HEX.match(digest):
            raise KeyFileError(f"{where}: 'sha256:' must be followed by 64 hex digits")
    else:
        digest = hash_key(key)
    return Key(name, digest, scope)


def read_keys(path: Path) -> list[Key]:
    """Every key in the file (a missing file has none); a malformed line is an error naming it."""
    path = Path(path)
    if not path.is_file():
        return []
    keys: list[Key] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        key = parse_line(line, f"{path}:{n}")
        if key is None:
            continue
        if any(k.name == key.name for k in keys):
            raise KeyFileError(f"{path}:{n}: the name {key.name!r} appears twice")
        keys.append(key)
    return keys


def _write_atomic(path: Path, lines: list[str]) -> None:
    """The whole file written beside it, fsynced and renamed over it (readers see old or new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(f"{line}\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):   # the rename itself, durable (not on Windows)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def add_key(path: Path, name: str, scope: str = USER) -> str:
    """A new random key for ``name``, appended as its hash; the key itself is returned (once)."""
    if not _NAME.match(name):
        raise InvalidRequest(f"the name {name!r} must be letters, digits, '.', '_' or '-' (at most 64)",
                             param="name")
    if scope not in SCOPES:
        raise InvalidRequest(f"the scope must be one of {', '.join(SCOPES)}, got {scope!r}", param="scope")
    path = Path(path)
    existing = read_keys(path)
    if any(k.name == name for k in existing):
        raise InvalidRequest(f"a key named {name!r} exists; revoke it first", param="name")
    key = "osk-" + secrets.token_urlsafe(32)
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else [
        "# ortserve API keys: NAME KEY SCOPE (KEY: the key or sha256:HEX; SCOPE: admin | user)"]
    _write_atomic(path, [*lines, f"{name} sha256:{hash_key(key)} {scope}"])
    return key


def revoke_key(path: Path, name: str) -> Key:
    """Remove the line of ``name`` (comments and other lines are kept as they are)."""
    path = Path(path)
    keys = {k.name: k for k in read_keys(path)}
    if name not in keys:
        raise InvalidRequest(f"no key named {name!r} in {path}", param="name")
    kept = [line for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if (k := parse_line(line, f"{path}:{n}")) is None or k.name != name]
    _write_atomic(path, kept)
    return keys[name]


class KeyRing:
    """The key file as the server reads it: re-read when it changes (mtime, size, inode)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._keys: list[Key] = []

    def _fresh(self) -> list[Key]:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        with self._lock:
            if stamp != self._stamp:
                self._keys = read_keys(self.path)   # a bad file raises: refuse rather than guess
                self._stamp = stamp
            return self._keys

    def lookup(self, token: str) -> Key | None:
        """The entry whose hash matches ``token``, comparing with every entry (constant time)."""
        digest = hash_key(token).encode()
        found = None
        for k in self._fresh():
            if hmac.compare_digest(digest, k.digest.encode()):
                found = k
        return found
