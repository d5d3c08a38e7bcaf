"""The install-clash detector: exactly one onnxruntime and one onnxruntime-genai build."""

from __future__ import annotations

import shlex

from ortserve.engine.packages import check_install


def test_this_environment_has_exactly_one_pair() -> None:
    rep = check_install()  # the real installed distributions of the test venv
    assert rep.ok, rep.problems
    assert len(rep.runtimes) == 1 and len(rep.genai) == 1 and rep.fix is None


def test_cpu_and_cuda_builds_side_by_side_are_a_clash_with_one_fix() -> None:
    rep = check_install(["onnxruntime", "onnxruntime-gpu", "onnxruntime-genai", "onnxruntime-genai-cuda"])
    assert not rep.ok and rep.target == "cuda"
    assert any("onnxruntime and onnxruntime-gpu are installed together" in p for p in rep.problems)
    assert any("onnxruntime-genai and onnxruntime-genai-cuda" in p for p in rep.problems)
    uninstall, install = rep.fix.split(" && ")
    removed = set(shlex.split(uninstall)[5:])
    assert removed == {"onnxruntime", "onnxruntime-gpu", "onnxruntime-genai", "onnxruntime-genai-cuda"}
    assert shlex.split(install)[4:] == ["onnxruntime-genai-cuda", "onnxruntime-gpu"]


def test_a_genai_build_paired_with_the_wrong_runtime_is_reported() -> None:
    rep = check_install(["onnxruntime", "onnxruntime-genai-cuda"])
    assert not rep.ok
    assert rep.problems == [("onnxruntime-genai-cuda is built against onnxruntime-gpu, which is not installed "
                             "(found onnxruntime)")]
    assert rep.fix.endswith("pip install onnxruntime-genai-cuda onnxruntime-gpu")


def test_directml_pair_is_fine_and_missing_runtime_is_not() -> None:
    assert check_install(["onnxruntime-directml", "onnxruntime-genai-directml"]).ok
    rep = check_install(["onnxruntime-genai"])
    assert not rep.ok and "no onnxruntime distribution is installed" in rep.problems
    assert rep.fix == "python -m pip uninstall -y onnxruntime-genai && python -m pip install onnxruntime-genai onnxruntime"
