"""The default embedding model's first-use import (a child process) on a full disk: a 507 naming
the disk, not a 500 (found when a hog run of the suite filled the disk: "importing the default
embedding model failed: OSError: [Errno 28] ..." went out as a 500 with no code)."""

from __future__ import annotations

import subprocess

import pytest

from ortserve.errors import OrtServeError, StorageFull
from ortserve.models import embed_import
from ortserve.models.store import ModelStore


def _child_fails_with(monkeypatch: pytest.MonkeyPatch, last_line: str) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(cmd, **kw):   # the child's exit as the server sees it; the child itself is not the subject
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr=f"Traceback ...\n{last_line}\n")

    monkeypatch.setattr(embed_import.subprocess, "run", run)
    return calls


@pytest.mark.parametrize("last_line", ["OSError: [Errno 28] No space left on device: '/h/models/.tmp/x'",
                                       "error: disk full while installing all-minilm-l6-v2:int8-cpu; nothing was installed",
                                       "sqlite3.OperationalError: database or disk is full"])
def test_a_full_disk_is_a_507_naming_the_disk(tmp_path, monkeypatch, last_line) -> None:
    store = ModelStore(tmp_path / "models")
    calls = _child_fails_with(monkeypatch, last_line)
    with pytest.raises(StorageFull) as err:
        embed_import.ensure_default_embedding(store)
    assert calls and calls[0][1:3] == ["-m", "ortserve.models.embed_import"]
    assert err.value.status == 507 and err.value.code == "insufficient_storage"
    assert str(tmp_path / "models") in err.value.message and last_line in err.value.message


def test_another_failure_stays_an_import_error(tmp_path, monkeypatch) -> None:
    _child_fails_with(monkeypatch, "ModuleNotFoundError: No module named 'torch'")
    with pytest.raises(OrtServeError, match="importing the default embedding model failed") as err:
        embed_import.ensure_default_embedding(ModelStore(tmp_path / "models"))
    assert not isinstance(err.value, StorageFull)
