"""Execution providers: what this machine can use, which one to pick, session options.

`auto` tries CUDA > DirectML > WebGPU > CPU, taking the next when one is missing or fails
to load, and remembers why it settled where it did.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from ortserve.errors import DependencyMissing
from ortserve.native import custom_ops_library, register_custom_ops, session_library  # noqa: F401 - the engine's names for them

log = logging.getLogger("ortserve.runtime")

ORDER = ("cuda", "dml", "webgpu", "cpu")
PROVIDERS = {"cuda": "CUDAExecutionProvider", "dml": "DmlExecutionProvider",
             "webgpu": "WebGpuExecutionProvider", "openvino": "OpenVINOExecutionProvider",
             "cpu": "CPUExecutionProvider"}
# the extra of ortserve that installs each device's runtime pair (see engine/packages.py)
EXTRAS = {"cuda": "cuda", "dml": "directml", "cpu": "cpu"}


@dataclass
class DeviceChoice:
    device: str
    provider: str
    reason: str


def available_devices() -> dict[str, bool]:
    """Which execution providers onnxruntime (and onnxruntime-genai) can use here."""
    import onnxruntime as ort

    have = set(ort.get_available_providers())
    out = {d: PROVIDERS[d] in have for d in PROVIDERS}
    out["cpu"] = True
    try:  # onnxruntime-genai's own view, when installed
        import onnxruntime_genai as og

        checks = {"cuda": "is_cuda_available", "dml": "is_dml_available",
                  "webgpu": "is_webgpu_available", "openvino": "is_openvino_available"}
        for d, fn in checks.items():
            out[f"genai_{d}"] = bool(getattr(og, fn, lambda: False)())
    except ImportError:
        pass
    return out


def candidates(requested: str, have: dict[str, bool] | None = None) -> list[DeviceChoice]:
    """Devices to try, in order. An explicit device that is not available is an error.

    ``have`` replaces the probe of this machine (tests fake a CUDA machine with it).
    """
    have = available_devices() if have is None else {**have, "cpu": True}
    if requested != "auto":
        if not have.get(requested):
            raise DependencyMissing(f"device {requested!r} is not available on this machine "
                                    f"({PROVIDERS.get(requested, requested)} missing)",
                                    hint=missing_device_hint(requested))
        return [DeviceChoice(requested, PROVIDERS[requested], "requested")]
    out = []
    skipped = [d for d in ORDER if not have.get(d)]
    for d in ORDER:
        if have.get(d):
            why = "auto: first available of cuda > dml > webgpu > cpu"
            if skipped and d == "cpu":
                why = f"auto: {', '.join(skipped)} not available"
            out.append(DeviceChoice(d, PROVIDERS[d], why))
    return out


def gpu_facts(nvidia_smi: str = "nvidia-smi") -> list[dict[str, Any]]:
    """Name and memory (MiB) of each NVIDIA GPU, from nvidia-smi; [] where there is none."""
    import shutil
    import subprocess

    exe = shutil.which(nvidia_smi)
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,name,memory.total,memory.free",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             encoding="utf-8", timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed: %s", exc)
        return []
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            gpus.append({"index": int(parts[0]), "name": parts[1], "memory_total_mb": int(parts[2]),
                         "memory_free_mb": int(parts[3])})
    return gpus


def missing_device_hint(device: str) -> str:
    """What actually fixes a missing provider, given what is installed now."""
    from ortserve.engine.packages import check_install

    report = check_install()
    if not report.ok:  # a clash hides the GPU build: repair it rather than install more
        return f"{report.problems[0]}; fix: {report.fix}"
    extra = EXTRAS.get(device)
    if device == "cuda" and "onnxruntime-gpu" in report.runtimes:
        return ("onnxruntime-gpu is installed but cannot load CUDA: install the NVIDIA driver and the CUDA "
                "12/13 runtime with cuDNN 9 (or `pip install 'onnxruntime-gpu[cuda,cudnn]'`), "
                "or use --device cpu / --device auto")
    if extra is None:
        return f"this build of ortserve has no package for {device}; use --device cpu / --device auto"
    fix = f"python -m pip uninstall -y {' '.join(report.runtimes + report.genai)} && " if report.genai else ""
    return (f"{fix}pip install 'ortserve[{extra}]' (exactly one onnxruntime build per environment), "
            "or use --device cpu / --device auto")


def session_options(settings: Any, model_options: dict[str, Any] | None = None) -> Any:
    """onnxruntime SessionOptions from settings (and the model's genai_config session options)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    model_options = model_options or {}
    intra = getattr(settings, "intra_op_threads", 0) or model_options.get("intra_op_num_threads", 0)
    inter = getattr(settings, "inter_op_threads", 0) or model_options.get("inter_op_num_threads", 0)
    if intra:
        so.intra_op_num_threads = int(intra)
    if inter:
        so.inter_op_num_threads = int(inter)
    level = getattr(settings, "graph_optimization_level", "all")
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    so.enable_cpu_mem_arena = bool(getattr(settings, "enable_mem_arena", True))
    spin = "1" if spinning_wanted(getattr(settings, "thread_spinning", "auto")) else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", spin)
    return so


def spinning_wanted(setting: bool | str, loadavg: Any = None, cores: int | None = None) -> bool:
    """Whether ONNX Runtime's worker threads should spin. Spinning saves a thread wake-up per kernel
    (a step runs ~670 small kernels): +25% single-stream decode on the idle 2-core machine (docs/bench.md),
    but about 5x slower under load, where spinning threads take the cores the work needs. ``auto`` spins
    when the machine is idle as the model loads: a quiet server spins, a busy or shared desktop does not."""
    if setting != "auto":
        return bool(setting)
    try:
        load = (loadavg or os.getloadavg)()[0]
    except (OSError, AttributeError):  # Windows has no load average: a desktop, so no spinning
        return False
    return bool(load < 0.5 * (cores or os.cpu_count() or 1))
