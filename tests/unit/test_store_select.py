"""Hardware-aware selection over manifests (quality, speed, device). No model needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ortserve.errors import ModelError, NotFound
from ortserve.models.select import resolve
from ortserve.models.store import ModelStore


def add(store: ModelStore, model: str, variant: str, precision: str, device: str,
        delta: float | None = None, tps: float | None = None, aliases: list[str] | None = None) -> None:
    def build(tmp: Path) -> dict[str, Any]:
        (tmp / "model.onnx").write_bytes(variant.encode())
        quality = {"perplexity": 10.0, "reference_perplexity": 10.0, "delta_pct": delta} if delta is not None else {}
        speed = {"decode_tps": tps, "device": device} if tps is not None else {}
        return {"precision": precision, "device": device, "quality": quality, "speed": speed,
                "aliases": aliases or []}

    store.install(model, variant, build)


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


def test_cpu_takes_the_fastest_variant_within_one_percent(store: ModelStore) -> None:
    add(store, "m", "fp32-cpu", "fp32", "cpu", 0.0, 40.0)
    add(store, "m", "int8-cpu", "int8", "cpu", 0.4, 70.0, aliases=["default"])
    add(store, "m", "int4-cpu", "int4", "cpu", 7.5, 95.0)
    r = resolve(store, "m", "cpu")
    assert r.model_id == "m:int8-cpu" and r.path.name == "m--int8-cpu"
    assert "within 1%" in r.reason and "int4-cpu is faster" in r.reason and "+7.50%" in r.reason
    # an alias resolves to the same model's best variant
    assert resolve(store, "default", "cpu").model_id == "m:int8-cpu"


def test_a_better_measured_variant_beats_the_default_precision(store: ModelStore) -> None:
    add(store, "m", "int8-cpu", "int8", "cpu", 0.6, 60.0)
    add(store, "m", "int4-cpu-k_quant-last8", "int4", "cpu", 0.8, 90.0)
    assert resolve(store, "m", "cpu").model_id == "m:int4-cpu-k_quant-last8"


def test_without_measurements_cpu_prefers_int8(store: ModelStore) -> None:
    add(store, "m", "fp32-cpu", "fp32", "cpu")
    add(store, "m", "int8-cpu", "int8", "cpu")
    add(store, "m", "int4-cpu", "int4", "cpu")
    r = resolve(store, "m", "cpu")
    assert r.model_id == "m:int8-cpu" and "preferred precision" in r.reason


def test_quality_budget_filters_preference_order(store: ModelStore) -> None:
    add(store, "m", "int8-cpu", "int8", "cpu", 3.0)
    add(store, "m", "fp32-cpu", "fp32", "cpu", 0.0)
    assert resolve(store, "m", "cpu").model_id == "m:fp32-cpu"


def test_cuda_prefers_fp16_then_int4_cuda_builds(store: ModelStore) -> None:
    add(store, "m", "int8-cpu", "int8", "cpu", 0.3, 60.0)
    add(store, "m", "int4-cuda", "int4", "cuda")
    assert resolve(store, "m", "cuda").model_id == "m:int4-cuda"
    add(store, "m", "fp16-cuda", "fp16", "cuda")
    r = resolve(store, "m", "cuda")
    assert r.model_id == "m:fp16-cuda" and r.device == "cuda"


def test_devices_without_their_own_build_fall_back_to_cpu_and_say_how_to_build(store: ModelStore) -> None:
    add(store, "m", "int8-cpu", "int8", "cpu", 0.3, 60.0)
    for device in ("dml", "webgpu", "cuda"):
        r = resolve(store, "m", device)
        assert r.model_id == "m:int8-cpu"
        assert f"no {device} variant installed" in r.reason and f"--device {device}" in r.reason
    assert resolve(store, "m", "directml").device == "dml"
    assert resolve(store, "m", "auto").model_id == "m:int8-cpu"


def test_explicit_variant_and_directory_refs(store: ModelStore, tmp_path: Path) -> None:
    add(store, "m", "fp32-cpu", "fp32", "cpu", 0.0, 10.0)
    add(store, "m", "int8-cpu", "int8", "cpu", 0.2, 50.0)
    r = resolve(store, "m:fp32-cpu", "cpu")
    assert r.model_id == "m:fp32-cpu" and "named explicitly" in r.reason
    d = tmp_path / "some-model"
    d.mkdir()
    r = resolve(store, str(d), "cpu")
    assert r.path == d and r.variant is None and "used as-is" in r.reason


def test_unknown_refs_fail_with_a_hint(store: ModelStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound) as info:
        resolve(store, "qwen2-0.5b-instruct", "cpu")
    assert "ortserve models pull qwen2-0.5b-instruct" in info.value.one_line()
    with pytest.raises(NotFound):
        resolve(store, "nothing-here", "cpu")
    with pytest.raises(ModelError, match="does not exist"):
        resolve(store, str(tmp_path / "missing-dir"), "cpu")


CUDA_MACHINE = {"cuda": True, "dml": False, "webgpu": False}
CPU_MACHINE = {"cuda": False, "dml": False, "webgpu": False}


def test_auto_on_a_cuda_machine_takes_the_best_gpu_variant_within_budget(store: ModelStore) -> None:
    add(store, "m", "q4_1-cpu", "q4_1", "cpu", 0.0, 140.0)
    add(store, "m", "fp16-cuda", "fp16", "cuda", 0.01, 900.0)
    add(store, "m", "int4-cuda", "int4", "cuda", 0.6, 1400.0)
    add(store, "m", "int4-rtn-cuda", "int4", "cuda", 25.0, 1600.0)
    r = resolve(store, "m", "auto", have=CUDA_MACHINE)
    assert r.device == "cuda" and r.model_id == "m:int4-cuda", r.reason
    assert "int4-rtn-cuda is faster" in r.reason  # and why it was passed over
    # the same store on a machine without a GPU serves the CPU variant
    assert resolve(store, "m", "auto", have=CPU_MACHINE).model_id == "m:q4_1-cpu"


def test_auto_on_a_cuda_machine_without_gpu_variant_says_how_to_build_one(store: ModelStore) -> None:
    add(store, "m", "q4_1-cpu", "q4_1", "cpu", 0.0, 140.0)
    r = resolve(store, "m", "auto", have=CUDA_MACHINE)
    assert r.model_id == "m:q4_1-cpu" and r.device == "cuda"
    assert "no cuda variant installed" in r.reason and "--device cuda --precision fp16" in r.reason


def test_auto_prefers_directml_variants_on_a_directml_machine(store: ModelStore) -> None:
    add(store, "m", "q4_1-cpu", "q4_1", "cpu", 0.0)
    add(store, "m", "int4-dml", "int4", "dml", 0.5)
    r = resolve(store, "m", "auto", have={"cuda": False, "dml": True, "webgpu": False})
    assert r.model_id == "m:int4-dml" and r.device == "dml"


def test_the_default_model_is_its_q4_1_variant_when_the_fp32_reference_is_installed_too(store: ModelStore) -> None:
    from ortserve.models.catalog import DEFAULT_MODEL
    from ortserve.models.importer import ensure_default

    add(store, DEFAULT_MODEL, "fp32-cpu", "fp32", "cpu", 0.0, 4.8)   # sorts first
    add(store, DEFAULT_MODEL, "q4_1-cpu", "q4_1", "cpu", 0.0, 32.9)  # manifests write precisions in lower case
    assert ensure_default(store).path.name == f"{DEFAULT_MODEL}--q4_1-cpu"
    assert ensure_default(store).path == resolve(store, DEFAULT_MODEL, "cpu").path  # what serving picks
