"""Bundle checks without pip: target markers close the wheel set; tampering is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ortserve.bundle import (
    SUMS,
    Target,
    _missing_for_target,
    _reachable,
    check_sums,
    import_bundle,
    write_sums,
)
from ortserve.errors import InvalidRequest, StoreError
from ortserve.models.store import MANIFEST, ModelStore, dir_name


def _item(name: str, requires: list[str], extras: list[str] | None = None) -> dict:
    return {"metadata": {"name": name, "version": "1.0", "requires_dist": requires},
            "download_info": {"url": f"https://x/{name}-1.0-py3-none-any.whl"}, "requested_extras": extras}


REPORT = [_item("ortserve", ["click>=8", 'onnxruntime>=1.20; extra == "cpu"', 'torch; extra == "convert"']),
          _item("click", ['colorama; platform_system == "Windows"']),
          _item("onnxruntime", ["numpy"]), _item("numpy", []),
          _item("uvloop", []), _item("tqdm", ['colorama; platform_system == "Windows"'])]


def test_target_markers_find_what_the_build_machine_skips() -> None:
    win, linux = Target("win_amd64", "3.12", "cpu"), Target("manylinux", "3.12", "cpu")
    assert _missing_for_target(REPORT, win) == ["colorama"]  # click and tqdm need it on Windows
    assert _missing_for_target(REPORT, linux) == []
    # uvloop was resolved but nothing the target needs asks for it (a build-machine-only pick)
    assert _reachable(REPORT, linux) == {"ortserve", "click", "onnxruntime", "numpy"}


def test_targets_are_checked() -> None:
    with pytest.raises(InvalidRequest, match="dml has no build for manylinux"):
        Target("manylinux", "3.12", "dml")
    with pytest.raises(InvalidRequest, match="unsupported Python"):
        Target("win_amd64", "3.9", "cpu")
    t = Target("win_amd64", "3.13", "dml", ("telemetry",))
    assert t.requirement == "ortserve[directml,telemetry]"
    assert t.pip_target_args()[:7] == ["--only-binary=:all:", "--python-version", "3.13", "--implementation",
                                       "cp", "--abi", "cp313"]


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A bundle with one fake model variant, built the way `ortserve bundle` lays it out."""
    store = ModelStore(tmp_path / "src-store")

    def build(tmp: Path) -> dict:
        (tmp / "model.onnx").write_bytes(b"\x08\x01weights")
        (tmp / "genai_config.json").write_text('{"model": {"type": "llama"}}', encoding="utf-8")
        return {"precision": "fp32", "device": "cpu", "quality": {"perplexity": 12.5}}

    v = store.install("tiny", "fp32-cpu", build)
    root = tmp_path / "bundle"
    shutil.copytree(v.path, root / "models" / dir_name("tiny", "fp32-cpu"))
    (root / "wheels").mkdir()
    (root / "wheels" / "x-1.0-py3-none-any.whl").write_bytes(b"PK")
    write_sums(root)
    return root


def test_an_intact_bundle_installs_with_its_manifest(bundle: Path, tmp_path: Path) -> None:
    assert check_sums(bundle) == []
    store = ModelStore(tmp_path / "target")
    [v] = import_bundle(bundle, store)
    assert v.id == "tiny:fp32-cpu" and v.quality == {"perplexity": 12.5}
    assert store.verify(store.get("tiny:fp32-cpu")) == {"corrupt": [], "missing": [], "extra": []}


@pytest.mark.parametrize("tamper, message", [
    (lambda b: (b / "models/tiny--fp32-cpu/model.onnx").write_bytes(b"evil"), "model.onnx: SHA-256 does not match"),
    (lambda b: (b / "wheels/x-1.0-py3-none-any.whl").unlink(), "x-1.0-py3-none-any.whl: missing"),
    (lambda b: (b / "models/tiny--fp32-cpu/extra.py").write_text("x", encoding="utf-8"), "extra.py: not listed"),
    (lambda b: (b / SUMS).unlink(), "SHA256SUMS is missing"),
])
def test_a_tampered_bundle_is_refused_and_nothing_installed(bundle: Path, tmp_path: Path, tamper, message) -> None:
    tamper(bundle)
    store = ModelStore(tmp_path / "target")
    with pytest.raises(StoreError, match=message):
        import_bundle(bundle, store)
    assert store.variants() == []


def test_a_file_changed_with_its_sums_redone_still_fails_the_manifest(bundle: Path, tmp_path: Path) -> None:
    (bundle / "models/tiny--fp32-cpu/model.onnx").write_bytes(b"evil")
    write_sums(bundle)  # whoever changed it also rewrote SHA256SUMS
    manifest = json.loads((bundle / "models/tiny--fp32-cpu" / MANIFEST).read_text(encoding="utf-8"))
    assert "model.onnx" in manifest["files"]
    with pytest.raises(StoreError, match=r"refusing tiny--fp32-cpu: its files do not match its manifest \(model.onnx"):
        import_bundle(bundle, ModelStore(tmp_path / "target"))
