"""Nothing leaks through the runtime: onnxruntime's own 1DS telemetry stays off under ortserve."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

VENDOR_DIR = Path(".cache") / "Microsoft" / "DeveloperTools"
BARE_SESSION = """
import onnx, onnxruntime as ort
from onnx import TensorProto, helper
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 9
ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
"""


# The runtime records nothing where it detects a CI service (CI=true does it), so these are removed:
# the tests must see what a user's machine does.
CI_MARKERS = ("CI", "CONTINUOUS_INTEGRATION", "GITHUB_ACTIONS", "TF_BUILD", "GITLAB_CI", "JENKINS_URL",
              "BUILDKITE", "CIRCLECI", "TRAVIS", "BUILD_ID", "BUILD_NUMBER", "RUN_ID")


def _env(home: Path, **extra: str) -> dict[str, str]:
    drop = {"ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME", *CI_MARKERS}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "HOME": str(home), "ORTSERVE_HOME": str(home / "ortserve"), **extra}


def _vendor_files(home: Path) -> list[str]:
    return sorted(p.name for p in (home / VENDOR_DIR).rglob("*") if p.is_file())


def test_the_runtime_writes_its_telemetry_queue_without_ortserve(tmp_path: Path) -> None:
    """The control: a bare onnxruntime session (no ortserve import) in a fresh HOME."""
    r = subprocess.run([sys.executable, "-c", BARE_SESSION], env=_env(tmp_path), capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    files = _vendor_files(tmp_path)
    if not files:
        pytest.skip("this onnxruntime build has no 1DS telemetry, so there is nothing to switch off")
    assert any(f.endswith(".db") for f in files) and "deviceid" in files


def test_ortserve_turns_the_runtime_telemetry_off(tiny_model: Path, tmp_path: Path) -> None:
    """A real generation through the CLI (onnxruntime + onnxruntime-genai) writes nothing vendor-side."""
    r = subprocess.run([sys.executable, "-m", "ortserve.cli.main", "ask", "hello", "--model", str(tiny_model),
                        "--max-tokens", "4", "--temperature", "0"], env=_env(tmp_path), capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()  # it did generate
    assert _vendor_files(tmp_path) == []


def test_a_user_can_opt_back_in(tmp_path: Path) -> None:
    """ORT_DISABLE_TELEMETRY set by the user wins over ortserve's default."""
    code = "import ortserve, os; print(os.environ['ORT_DISABLE_TELEMETRY'])"
    r = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, ORT_DISABLE_TELEMETRY="0"),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.stdout.strip() == "0"
    r = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.stdout.strip() == "1"
