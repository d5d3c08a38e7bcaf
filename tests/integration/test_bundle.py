"""`ortserve bundle` for real: pip resolves and downloads the wheels (this needs the package index,
like `make test` itself); the bundle then installs into a fresh venv with --no-index, and the
venv's `ortserve serve` answers. Also: every dependency has a Windows wheel (resolve only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import free_port, wait_healthy

from ortserve.bundle import build_ortserve_wheel
from ortserve.models.store import ModelStore

CLI = [sys.executable, "-m", "ortserve.cli.main"]
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace", timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_ortserve_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def home(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding the tiny model as tiny:fp32-cpu."""
    home = tmp_path_factory.mktemp("build-home")

    def build(tmp: Path) -> dict:
        shutil.copytree(tiny_model, tmp, dirs_exist_ok=True)
        return {"precision": "fp32", "device": "cpu", "architecture": "llama"}

    ModelStore(home / "models").install("tiny", "fp32-cpu", build)
    return home


def test_every_dependency_has_a_windows_wheel(wheel: Path, tmp_path: Path) -> None:
    r = run([*CLI, "bundle", "--platform", "win_amd64", "--python", "3.12", "--device", "cpu", "--resolve-only",
             "--ortserve-wheel", str(wheel), "--out", str(tmp_path / "b"), "--json"])
    assert r.returncode == 0, r.stderr
    wheels = json.loads(r.stdout)["wheels"]
    assert all(w.endswith(("-win_amd64.whl", "-none-any.whl")) for w in wheels), wheels
    names = {w.split("-")[0].lower() for w in wheels}
    assert {"ortserve", "onnxruntime", "onnxruntime_genai", "numpy", "fastapi", "uvicorn", "filelock"} <= names
    assert "colorama" in names  # click's Windows-only dependency, which pip on Linux would skip
    assert "torch" not in names  # the conversion extra stays out of a serving bundle


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path, home: Path) -> Iterator[tuple[Path, Path]]:
    out = tmp_path_factory.mktemp("bundle") / "b"
    r = run([*CLI, "bundle", "--models", "tiny", "--ortserve-wheel", str(wheel), "--out", str(out)],
            env={"ORTSERVE_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    venv = tmp_path_factory.mktemp("venv") / "v"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(venv)]).returncode == 0
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # pip from this environment installs into the fresh one; no index, no config, no find-links
    offline = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "",
               "PIP_NO_INDEX": "1", "PYTHONPATH": ""}  # this checkout's src/ must not look installed
    r = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-index",
             "--find-links", str(out / "wheels"), "ortserve[cpu]"], env=offline)
    assert r.returncode == 0, r.stderr
    yield out, venv


def test_the_bundle_installs_offline_and_serves(venv: tuple[Path, Path], tmp_path: Path) -> None:
    out, v = venv
    assert (out / "SHA256SUMS").is_file() and "pip install --no-index" in (out / "INSTALL.md").read_text(
        encoding="utf-8")
    ortserve = v / ("Scripts/ortserve.exe" if os.name == "nt" else "bin/ortserve")
    env = {"ORTSERVE_HOME": str(tmp_path / "target"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    r = run([str(ortserve), "models", "import-bundle", str(out), "--json"], env=env)
    assert r.returncode == 0, r.stderr
    assert [m["id"] for m in json.loads(r.stdout)] == ["tiny:fp32-cpu"]
    port = free_port()
    proc = subprocess.Popen([str(ortserve), "serve", "--model", "tiny", "--port", str(port)],
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            encoding="utf-8", errors="replace")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 120, proc)
        r2 = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r2.status_code == 200 and r2.json()["usage"]["completion_tokens"] >= 1
        # the served code is the venv's copy, not this checkout's
        assert str(v) in run([str(v / "bin/python"), "-c", "import ortserve; print(ortserve.__file__)"],
                             env={"PYTHONPATH": ""}).stdout
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_tampered_bundle_is_refused_by_the_installed_cli(venv: tuple[Path, Path], tmp_path: Path) -> None:
    out, v = venv
    copy = tmp_path / "copy"
    shutil.copytree(out / "models", copy / "models")
    shutil.copy2(out / "SHA256SUMS", copy / "SHA256SUMS")
    lines = (copy / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    (copy / "SHA256SUMS").write_text("\n".join(ln for ln in lines if " models/" in ln) + "\n", encoding="utf-8")
    target = next((copy / "models").glob("*/genai_config.json"))
    target.write_text(target.read_text(encoding="utf-8").replace("{", "{ ", 1), encoding="utf-8")
    r = run([str(v / "bin/ortserve"), "models", "import-bundle", str(copy)],
            env={"ORTSERVE_HOME": str(tmp_path / "t"), "PYTHONPATH": ""})
    assert r.returncode == 2
    assert "refusing the bundle" in r.stderr and "genai_config.json: SHA-256 does not match SHA256SUMS" in r.stderr
    assert not (tmp_path / "t" / "models").exists() or not any((tmp_path / "t" / "models").glob("tiny*"))
