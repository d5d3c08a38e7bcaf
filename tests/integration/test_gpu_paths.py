"""GPU code paths that CI (no GPU) can still exercise: auto on a (faked) CUDA machine builds
and picks a CUDA variant; the runner's device-resident path on the CPU provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    assert model == "tiny:fp16-cuda" and path.name == "tiny--fp16-cuda"
    assert any("building tiny fp16-cuda" in m for m in messages)
    cfg = json.loads((path / "genai_config.json").read_text(encoding="utf-8"))
    assert "cuda" in json.dumps(cfg["model"]["decoder"]["session_options"]).lower()
    assert {v.variant for v in store.find("tiny")} == {"fp32-cpu", "fp16-cuda"}
    # the second start finds it: nothing is built again
    messages.clear()
    assert resolve_model_dir("tiny", settings, messages.append)[0] == path and not messages


def _run_batch(model_dir: Path, placement: str, params: list) -> tuple[list[tuple[str, int]], Any, int]:
    """Each prompt alone, then all at once with their own lengths (rows retire at different steps)."""
    import queue

    from ortserve.engine.llm import LLM

    settings = load_settings(kv_placement=placement, max_batch=4)
    with LLM(model_dir, settings) as llm:
        moves = 0
        move = llm.core.runner.kv.move_row

        def counted(*a: Any) -> None:
            nonlocal moves
            moves += 1
            move(*a)

        llm.core.runner.kv.move_row = counted
        prompts = [f"Story {i}: once upon a time" + " and then" * (3 * i) for i in range(len(params))]
        alone = [llm.generate([p], sp, progress=False)[0] for p, sp in zip(prompts, params)]
        events: queue.Queue = queue.Queue()
        ids = [llm._submit(p, sp, events.put) for p, sp in zip(prompts, params)]
        texts: dict[str, list[str]] = {i: [] for i in ids}
        counts: dict[str, int] = {}
        while len(counts) < len(ids):
            ev = events.get(timeout=120)
            texts[ev.request_id].append(ev.text)
            if ev.finished:
                counts[ev.request_id] = ev.metrics.output_tokens
        together = [("".join(texts[i]), counts[i]) for i in ids]
        return [(o.text, o.metrics.output_tokens) for o in alone] + together, llm.core.runner, moves


def test_device_resident_kv_gives_the_same_tokens_as_host_kv(tiny_model: Path) -> None:
    from ortserve.engine.kvcache import DeviceKV, HostKV
    from ortserve.types import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=24 + 7 * i) for i in range(3)]
    params += [SamplingParams(temperature=0.9, top_p=0.9, seed=11 + i, max_tokens=40 + 9 * i) for i in range(3)]
    host, host_runner, host_moves = _run_batch(tiny_model, "host", params)
    device, device_runner, device_moves = _run_batch(tiny_model, "device", params)
    assert isinstance(host_runner.kv, HostKV) and isinstance(device_runner.kv, DeviceKV)
    assert all(n > 0 and text for text, n in host)
    assert host[:6] == host[6:]  # batched rows equal the same request alone
    assert device == host
    assert device_moves > 0 and device_moves == host_moves  # compaction ran on the device path


def test_device_kv_grows_moves_and_shrinks_like_host_kv() -> None:
    import numpy as np

    from ortserve.engine.kvcache import DeviceKV, HostKV

    rng = np.random.default_rng(0)
    host, dev = HostKV(2, np.float32), DeviceKV(2, np.float32, "cpu", ["CPUExecutionProvider"])
    for kv in (host, dev):
        kv.allocate((2, 3, 8, 4), 0, 0)
    assert all(not dev.row(i, r).any() for i in range(2) for r in range(2))  # fresh device memory is zeroed
    data = rng.standard_normal((2, 2, 3, 8, 4)).astype(np.float32)
    for i in range(2):
        host.bufs[i][:] = data[i]
        for r in range(2):  # write through a device-side copy from a host staging value
            staging = DeviceKV(1, np.float32, "cpu", ["CPUExecutionProvider"])
            staging.allocate((1, 3, 8, 4), 0, 0)
            staging.bufs[0].update_inplace(np.ascontiguousarray(data[i, r:r + 1]))
            io = dev._copy.io_binding()
            io.bind_ortvalue_input("x", staging.bufs[0])
            io.bind_output("y", "cpu", 0, np.float32, [1, 3, 8, 4], dev.pointer(i, r))
            dev._copy.run_with_iobinding(io)
    for shape, keep_rows, keep_tokens in (((4, 3, 16, 4), 2, 8), ((4, 3, 6, 4), 4, 6)):
        for kv in (host, dev):
            kv.allocate(shape, keep_rows, keep_tokens)
        for i in range(2):
            for r in range(shape[0]):
                np.testing.assert_array_equal(dev.row(i, r)[:, :keep_tokens], host.row(i, r)[:, :keep_tokens])
    for kv in (host, dev):
        kv.move_row(1, 3, 6)
    for i in range(2):
        np.testing.assert_array_equal(dev.row(i, 3), host.row(i, 3))
        np.testing.assert_array_equal(dev.row(i, 3)[:, :6], data[i, 1, :, :6])


def test_shipped_kv_graphs_are_the_ones_the_code_makes() -> None:
    from importlib import resources

    from ortserve.engine.kvcache import make_graphs

    for name, data in make_graphs().items():
        assert resources.files("ortserve").joinpath("data", name).read_bytes() == data, name


def test_gpu_benchmark_runs_on_the_cpu_provider(tiny_model: Path) -> None:
    """benchmarks/gpu.py is the GPU measurement; on CPU its code paths run, with positive figures."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "gpu.py", "--model", str(tiny_model), "--device", "cpu", "--gen", "8",
                        "--reps", "1", "--clients", "3", "--contexts", "40,100000"],
                       cwd=root / "benchmarks", capture_output=True, text=True, encoding="utf-8", timeout=600, check=False,
                       env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)
    for key in ("engine_single_decode_tps", "raw_og_single_decode_tps", "engine_concurrent_tps",
                "og_static_batch_tps", "og_engine_concurrent_tps"):
        assert data[key] > 0, key
    ok, skipped = data["by_context"]
    assert ok["context"] == 40 and ok["device_kv_decode_tps"] > 0 and ok["host_kv_decode_tps"] > 0
    assert "over the context length" in skipped["skipped"]
    assert set(data["ratios"]) == {"single_vs_raw_og", "concurrent_vs_og_engine", "concurrent_vs_og_static_batch"}


def test_kv_budget_follows_the_gpu_memory_when_the_cache_lives_there(tiny_model: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from ortserve.engine.engine import LoadedModel, kv_budget_bytes

    model = LoadedModel(tiny_model, load_settings(max_batch=64), "tiny")
    model.context_length = 1 << 20  # so the cap of every slot at full context does not bind
    ram = kv_budget_bytes(model)
    monkeypatch.setattr("ortserve.engine.runtime.gpu_facts", lambda: [
        {"index": 0, "name": "fake", "memory_total_mb": 81920, "memory_free_mb": 3000}])
    assert kv_budget_bytes(model) == ram  # a CPU-resident cache: the GPU's memory does not matter
    model.choice.device = "cuda"
    model.runner.kv.device = "cuda"
    model_bytes = sum(f.stat().st_size for f in tiny_model.glob("*.onnx*"))
    assert kv_budget_bytes(model) == ((3000 << 20) - model_bytes) // 2
    assert kv_budget_bytes(model, load_settings(kv_cache_mb=100)) == 100 << 20  # the setting caps it
