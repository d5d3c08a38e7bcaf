"""The crash-point hook (src/ortserve/faults.py) and the recovery it exercises, in process: an
injected ENOSPC at a point (what a full disk does there), the start-up sweep of the model store,
the upload temp files of a dead writer. The kills themselves are tests/integration/test_crash_safety.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ortserve import faults
from ortserve.errors import StorageFull, disk_full
from ortserve.models.store import MANIFEST, ModelStore
from ortserve.rag.index import RagStore


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    yield
    faults.arm(None)


def test_specs_parse_and_bad_ones_are_refused_by_name() -> None:
    assert faults.Fault.parse("rag.ingest.commit:3") == faults.Fault("rag.ingest.commit", 3, "kill")
    assert faults.Fault.parse("store.build:enospc") == faults.Fault("store.build", 1, "enospc")
    with pytest.raises(ValueError, match="unknown crash point 'nope'"):
        faults.Fault.parse("nope")
    with pytest.raises(ValueError, match="expected <point>"):
        faults.Fault.parse("store.build:0")


def test_the_armed_point_fires_on_its_nth_pass_only() -> None:
    faults.arm("ledger.commit:2:enospc")
    faults.point("ledger.commit")            # 1st: nothing
    faults.point("responses.commit")         # another point: nothing
    with pytest.raises(OSError) as err:
        faults.point("ledger.commit")
    assert disk_full(err.value)
    faults.point("ledger.commit")            # 3rd: nothing


def test_a_kill_point_sigkills_and_says_where(tmp_path: Path) -> None:
    code = "from ortserve import faults; faults.arm('rag.enqueued'); faults.point('rag.enqueued'); print('alive')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -9 and "alive" not in done.stdout
    assert "ortserve: crash point rag.enqueued #1" in done.stderr


def _variant(tmp: Path) -> dict[str, str]:
    (tmp / "w.bin").write_bytes(b"weights")
    return {"precision": "fp32", "device": "cpu"}


def test_a_full_disk_during_an_install_is_a_507_and_leaves_nothing(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    faults.arm("store.build:enospc")
    with pytest.raises(StorageFull) as err:
        store.install("m", "v", _variant)
    assert err.value.status == 507 and "nothing was installed" in err.value.message
    assert store.variants() == [] and list((tmp_path / "models" / ".tmp").iterdir()) == []


def test_the_start_sweep_puts_back_a_variant_a_killed_replace_moved_aside(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    v = store.install("m", "v", _variant)
    trash = tmp_path / "models" / ".tmp" / "m--v.old.0123abcd"      # as store.swap leaves it
    v.path.replace(trash)
    dead = tmp_path / "models" / ".tmp" / "m--v.999999.89abcdef"     # a killed build's temp dir
    dead.mkdir()
    (v.path.parent / "other--x").mkdir()
    (v.path.parent / "other--x" / f".{MANIFEST}.1234abcd").write_text("{")   # a manifest update cut short
    assert sorted(store.sweep()) == ["m--v", "other--x"]
    (back,) = store.variants()
    assert back.files == v.files and store.verify(back) == {"corrupt": [], "missing": [], "extra": []}
    assert list((tmp_path / "models" / ".tmp").iterdir()) == []
    assert list((v.path.parent / "other--x").iterdir()) == []


def test_upload_temp_files_of_a_dead_writer_roll_forward_or_go(tmp_path: Path) -> None:
    rag = RagStore(tmp_path / "rag", embedder=lambda: None)
    f = rag.add_file("a.md", b"# A\n\nalpha words")
    files = tmp_path / "rag" / "files"
    (files / f["id"]).replace(files / f".{f['id']}.999999.tmp")        # killed after its row committed
    (files / ".file-0123456789abcdef01234567.999999.tmp").write_bytes(b"x")   # killed before: no row
    rag.close()
    rag = RagStore(tmp_path / "rag", embedder=lambda: None)
    assert rag.file_bytes(f["id"]) == b"# A\n\nalpha words"
    assert sorted(p.name for p in files.iterdir()) == [f["id"]]
    faults.arm("rag.upload.written:enospc")
    with pytest.raises(StorageFull) as err:
        rag.add_file("b.md", b"# B\n\nbeta words")
    assert err.value.status == 507 and err.value.param == "file"
    assert sorted(p.name for p in files.iterdir()) == [f["id"]] and len(rag.files()) == 1
    rag.close()
    shutil.rmtree(tmp_path / "rag")
    assert json.dumps(err.value.to_openai()["error"]["code"]) == '"insufficient_storage"'
