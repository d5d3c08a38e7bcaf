"""A model folder's custom-op library (the GGUF-native kernels, models/gguf/native.py): named in
genai_config.json by its file name, resolved inside the folder, refused anywhere else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.test_store_validate import onnx_dir

from ortserve.engine.runtime import custom_ops_library, register_custom_ops
from ortserve.errors import ModelError
from ortserve.models.validate import check_onnx_dir
from ortserve.native import NativeStatus


def with_library(root: Path, name: str, create: bool = True) -> Path:
    d = onnx_dir(root)
    cfg = json.loads((d / "genai_config.json").read_text(encoding="utf-8"))
    cfg["model"]["decoder"]["session_options"] = {"custom_ops_library": name}
    (d / "genai_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    if create:
        (d / "libortserve_gguf.so").write_bytes(b"\x7fELF")
    return d


class Options:
    def __init__(self) -> None:
        self.libraries: list[str] = []

    def register_custom_ops_library(self, path: str) -> None:
        self.libraries.append(path)


def test_a_library_inside_the_folder_is_named_and_registered(tmp_path: Path) -> None:
    """ortserve's own sessions load the package's build when the ops are active (the folder's copy
    is as old as its import), the folder's copy otherwise; a folder that names none gets none."""
    d = with_library(tmp_path / "m", "libortserve_gguf.so")
    assert check_onnx_dir(d)["precision"] == "fp32"
    assert custom_ops_library(d) == (d / "libortserve_gguf.so").resolve()
    package = tmp_path / "package" / "libortserve_gguf.so"
    active = NativeStatus(True, "active", "avx2", package)
    off = NativeStatus(False, "disabled by setting (ORTSERVE_NATIVE=0)", "", package)
    assert register_custom_ops(Options(), d, native=active).libraries == [str(package)]
    assert register_custom_ops(Options(), d, native=off).libraries == [str((d / "libortserve_gguf.so").resolve())]
    assert custom_ops_library(onnx_dir(tmp_path / "plain")) is None
    assert register_custom_ops(Options(), tmp_path / "plain", native=active).libraries == []


@pytest.mark.parametrize("name", ["/usr/lib/libc.so.6", "../libortserve_gguf.so", "missing.so", 7])
def test_a_library_outside_the_folder_or_missing_is_refused(tmp_path: Path, name: object) -> None:
    d = with_library(tmp_path / "m", name, create=True)  # type: ignore[arg-type]
    (tmp_path / "libortserve_gguf.so").write_bytes(b"\x7fELF")
    with pytest.raises(ModelError, match="custom-op library"):
        check_onnx_dir(d)


def test_install_into_copies_a_library_that_differs_and_keeps_one_that_is_equal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The importers' copy of the library (native.install_into): written whole through a temporary
    file, rewritten only when the bytes differ; nothing to copy gives None."""
    from ortserve import native

    build = tmp_path / "build" / native.LIBRARY_NAME
    build.parent.mkdir()
    build.write_bytes(b"\x7fELF new kernels")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / native.LIBRARY_NAME).write_bytes(b"\x7fELF old kernels")
    copy = native.install_into(folder, build)
    assert copy == folder / native.LIBRARY_NAME and copy.read_bytes() == build.read_bytes()
    assert [p.name for p in folder.iterdir()] == [native.LIBRARY_NAME]   # no temporary file left
    stamp = copy.stat().st_mtime_ns
    assert native.install_into(folder, build) == copy and copy.stat().st_mtime_ns == stamp
    monkeypatch.setattr(native, "status", lambda: NativeStatus(False, "switched off", "", None))
    assert native.install_into(folder) is None
