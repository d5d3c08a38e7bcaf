"""The key file (issue 45): its format, the CLI-side writer, and the server-side ring."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.tenants import KeyRing, add_key, hash_key, read_keys, revoke_key
from ortserve.tenants.keyfile import KeyFileError


def test_a_key_file_reads_plain_and_hashed_keys_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# team keys\n\nalice  plain-secret  user   # a comment\nops sha256:{hash_key('s3')} admin\n",
                    encoding="utf-8")
    keys = read_keys(path)
    assert [(k.name, k.scope) for k in keys] == [("alice", "user"), ("ops", "admin")]
    ring = KeyRing(path)
    assert ring.lookup("plain-secret").name == "alice" and ring.lookup("s3").name == "ops"
    assert ring.lookup("plain-secret ") is None and ring.lookup("") is None and ring.lookup("sha256:") is None


@pytest.mark.parametrize(("line", "says"), [
    ("alice secret", "expected 'NAME KEY SCOPE'"),
    ("alice secret root", "the scope 'root'"),
    ("alice sha256:abc user", "64 hex digits"),
    ("al/ice secret user", "the name 'al/ice'"),
    ("alice a user\nalice b user", "appears twice"),
])
def test_a_bad_line_is_an_error_naming_the_file_and_line(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# header\n{line}\n", encoding="utf-8")
    with pytest.raises(KeyFileError, match=says) as e:
        read_keys(path)
    assert f"{path}:" in e.value.message


def test_add_writes_only_the_hash_and_revoke_takes_effect_on_the_next_lookup(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "keys"
    ring = KeyRing(path)
    assert ring.lookup("anything") is None            # no file yet: no keys
    key = add_key(path, "alice")
    other = add_key(path, "ops", "admin")
    text = path.read_text(encoding="utf-8")
    assert key not in text and f"alice sha256:{hash_key(key)} user" in text and text.startswith("#")
    assert ring.lookup(key).name == "alice" and ring.lookup(other).scope == "admin"
    with pytest.raises(Exception, match="exists"):
        add_key(path, "alice")
    revoke_key(path, "alice")
    assert ring.lookup(key) is None and ring.lookup(other).name == "ops"
    assert not list(path.parent.glob(".*.tmp"))       # written atomically, nothing left beside it
    assert (path.stat().st_mode & 0o777) == 0o600
