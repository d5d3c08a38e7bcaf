"""The native library's build and loader: what `status()` says in each case where the ops are off."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from ortserve import native
from ortserve.native import build as native_build

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the library builds on Linux")


@pytest.fixture
def fresh_status():
    native._status.cache_clear()
    yield
    native._status.cache_clear()


@pytest.fixture(scope="module")
def library() -> Path:
    result = native_build.build()
    assert result.ok, result.reason
    return result.library


def test_build_and_loader_name_the_same_file():
    assert native.LIBRARY_NAME == native_build.LIBRARY_NAME


def test_the_built_library_loads_and_registers(library, fresh_status):
    auto = native.status(enabled=True, isa="auto")
    assert auto.isa in {"avx512vnni", "avx2", "scalar"} and auto.library == library
    assert auto.active == (auto.isa != "scalar"), auto
    assert native.register(ort.SessionOptions(), auto) == auto.active
    lib = native._load(library)
    try:
        forced = native.status(enabled=True, isa="scalar")  # every CPU has the scalar path
        assert forced.active and forced.isa == "scalar" and lib.osg_isa() == b"scalar", forced
        assert native.register(ort.SessionOptions(), forced)
    finally:  # the choice is the process's: give the next tests the CPU's best again
        lib.osg_set_isa(b"avx512" if auto.isa == "avx512vnni" else auto.isa.encode())


def test_disabled_by_setting(monkeypatch, fresh_status):
    monkeypatch.setenv("ORTSERVE_NATIVE", "0")
    st = native.status()
    assert not st.active and st.reason.startswith("disabled by setting")
    assert not native.register(ort.SessionOptions(), st)


def test_not_built(monkeypatch, tmp_path, fresh_status):
    monkeypatch.setattr(native, "_PACKAGE_DIR", tmp_path)
    st = native.status(enabled=True, isa="auto")
    assert not st.active and st.library is None
    assert st.reason.startswith("not built") and "python -m ortserve.native.build" in st.reason


def test_failed_to_load(monkeypatch, tmp_path, fresh_status):
    (tmp_path / native.LIBRARY_NAME).write_bytes(b"not an ELF file")
    monkeypatch.setattr(native, "_PACKAGE_DIR", tmp_path)
    st = native.status(enabled=True, isa="auto")
    assert not st.active and st.reason.startswith("failed to load")


def test_a_compile_error_warns_and_builds_nothing(tmp_path):
    (tmp_path / "broken.c").write_text("int f(void) { return }\n", encoding="utf-8")
    result = native_build.build(tmp_path / "out", csrc=tmp_path)
    assert not result.ok and "exited with" in result.reason and "broken.c" in result.reason
    assert not (tmp_path / "out" / native.LIBRARY_NAME).exists()


def test_no_compiler(monkeypatch, tmp_path):
    (tmp_path / "ok.c").write_text("int f(void) { return 1; }\n", encoding="utf-8")
    monkeypatch.setattr(native_build, "compiler", lambda cc=None: None)
    result = native_build.build(tmp_path, csrc=tmp_path)
    assert not result.ok and result.reason.startswith("not built: no C compiler")


def test_rebuilt_when_a_source_is_newer(tmp_path):
    src = tmp_path / "one.c"
    src.write_text("int one(void) { return 1; }\n", encoding="utf-8")
    first = native_build.build(tmp_path, csrc=tmp_path)
    assert first.ok and first.reason == "built"
    assert native_build.build(tmp_path, csrc=tmp_path).reason == "up to date"
    header = tmp_path / "one.h"
    header.write_text("/* changed */\n", encoding="utf-8")
    newer = first.library.stat().st_mtime + 10
    os.utime(header, (newer, newer))
    assert native_build.build(tmp_path, csrc=tmp_path).reason == "built"


@pytest.mark.parametrize(("env", "line"), [
    ("0", "GGUF kernels  MatMulNBits (disabled by setting (ORTSERVE_NATIVE=0))"),
    ("1", "GGUF kernels  "),
])
def test_ortserve_info_says_which_path_and_why(monkeypatch, tmp_path, fresh_status, library, env, line):
    from click.testing import CliRunner

    from ortserve.cli.system import info

    monkeypatch.setenv("ORTSERVE_HOME", str(tmp_path))
    monkeypatch.setenv("ORTSERVE_NATIVE", env)
    result = CliRunner().invoke(info, [])
    assert result.exit_code == 0, result.output
    shown = next(x for x in result.output.splitlines() if x.startswith("GGUF kernels"))
    assert shown.startswith(line)
    st = native.status()
    assert shown.endswith(f"({st.reason})") and ("ortserve.gguf ops" in shown) == st.active


def test_an_isa_from_the_config_file_reaches_every_copy_of_the_library(monkeypatch, tmp_path, fresh_status,
                                                                       library):
    """A model folder holds its own copy of the library for onnxruntime-genai; each copy reads
    ORTSERVE_NATIVE_ISA itself, so a value from the config file is passed on through it."""
    (tmp_path / "ortserve.toml").write_text('native_isa = "scalar"\n', encoding="utf-8")
    monkeypatch.setenv("ORTSERVE_CONFIG", str(tmp_path / "ortserve.toml"))
    monkeypatch.delenv("ORTSERVE_NATIVE_ISA", raising=False)
    monkeypatch.delenv("ORTSERVE_NATIVE", raising=False)
    lib = native._load(library)
    best = lib.osg_isa().decode()
    try:
        st = native.status()
        assert st.active and st.isa == "scalar"
        assert os.environ["ORTSERVE_NATIVE_ISA"] == "scalar"
    finally:
        lib.osg_set_isa(b"avx512" if best == "avx512vnni" else best.encode())


def test_a_library_older_than_its_sources_says_so(monkeypatch, tmp_path, fresh_status, library):
    shutil.copyfile(library, tmp_path / native.LIBRARY_NAME)
    (tmp_path / "csrc").mkdir()
    newer = tmp_path / "csrc" / "ops.c"
    newer.write_text("/* edited */\n", encoding="utf-8")
    later = (tmp_path / native.LIBRARY_NAME).stat().st_mtime + 10
    os.utime(newer, (later, later))
    monkeypatch.setattr(native, "_PACKAGE_DIR", tmp_path)
    st = native.status(enabled=True, isa="auto")
    assert st.active == (st.isa != "scalar")
    if st.active:
        assert "older than csrc/" in st.reason and "python -m ortserve.native.build" in st.reason
