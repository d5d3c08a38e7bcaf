"""GPU code paths that CI (no GPU) can still exercise: auto on a (faked) CUDA machine builds
and picks a CUDA variant; the runner's device-resident path on the CPU provider."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortserve.config import load_settings
from ortserve.models.importer import import_hf_dir
from ortserve.models.locate import resolve_model_dir
from ortserve.models.store import ModelStore


def test_auto_on_a_cuda_machine_builds_the_gpu_variant_once(tiny_hf_dir: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(home=str(tmp_path / "home"))
    store = ModelStore(settings.store_dir)
    import_hf_dir(store, tiny_hf_dir, "tiny", precision="fp32")
    # this machine, as auto sees it: a CUDA provider is present
    monkeypatch.setattr("ortserve.engine.runtime.available_devices",
                        lambda: {"cuda": True, "dml": False, "webgpu": False, "openvino": False, "cpu": True})
    messages: list[str] = []
    path, model = resolve_model_dir("tiny", settings, messages.append)
    assert model == "tiny" and path.name == "tiny--fp16-cuda"
    assert any("building tiny fp16-cuda" in m for m in messages)
    cfg = json.loads((path / "genai_config.json").read_text(encoding="utf-8"))
    assert "cuda" in json.dumps(cfg["model"]["decoder"]["session_options"]).lower()
    assert {v.variant for v in store.find("tiny")} == {"fp32-cpu", "fp16-cuda"}
    # the second start finds it: nothing is built again
    messages.clear()
    assert resolve_model_dir("tiny", settings, messages.append)[0] == path and not messages
