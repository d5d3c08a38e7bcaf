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
    assert model == "tiny" and path.name == "tiny--fp16-cuda"
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
