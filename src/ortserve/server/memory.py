"""Memory accounting for the model manager: what a model is planned to hold (weights + KV
cache), the budget they share, and what the process really holds (RSS, for ps).

Policy (who loads, who is evicted, when) is ``server/manager.py``; this is arithmetic over
files, settings and the machine, with no state.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortserve.errors import OrtServeError

Estimator = Callable[[Path], int]            # model dir -> planned bytes
MB = 1 << 20


class InsufficientMemory(OrtServeError):
    """A model that cannot fit in the memory budget even with nothing else loaded."""

    status = 507
    type = "invalid_request_error"
    code = "model_too_large"


def weights_bytes(model_dir: Path) -> int:
    """Bytes of the model's weight files (ONNX graphs and external data)."""
    total = 0
    for p in Path(model_dir).iterdir():
        if p.is_file() and (p.suffix in (".onnx", ".data", ".bin") or p.name.endswith(".onnx.data")):
            total += p.stat().st_size
    return total


def chat_estimate(settings: Any, kv_tokens: int = 512) -> Estimator:
    """Planned memory of a chat model: weights + the KV cache of max_batch sequences of
    ``kv_tokens`` (the cache grows on demand, so this is what a busy model commonly holds)."""

    def estimate(model_dir: Path) -> int:
        return weights_bytes(model_dir) + kv_cap_bytes(settings, model_dir, kv_tokens)

    return estimate


def kv_cap_bytes(settings: Any, model_dir: Path, kv_tokens: int = 512) -> int:
    """The KV cache an on-demand model may use: kv_cache_mb when set, else max_batch sequences of
    ``kv_tokens`` (fp32). The manager loads on-demand models with exactly this cap."""
    mb = int(getattr(settings, "kv_cache_mb", 0) or 0)
    if mb:
        return mb * MB
    try:
        dec = json.loads((Path(model_dir) / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
        per_token = 2 * int(dec["num_hidden_layers"]) * int(dec["num_key_value_heads"]) * int(dec["head_size"])
    except (OSError, KeyError, TypeError, ValueError):
        return 0
    return per_token * 4 * int(getattr(settings, "max_batch", 16)) * kv_tokens


def default_budget(settings: Any) -> int:
    """The memory budget in bytes: the setting, else 80% of the RAM available at start
    (80% of the GPU's memory when serving on CUDA and nvidia-smi can say how much)."""
    mb = int(getattr(settings, "memory_budget_mb", 0) or 0)
    if mb > 0:
        return mb * MB
    if getattr(settings, "device", "auto") == "cuda":
        gpu = _gpu_total_bytes()
        if gpu:
            return int(gpu * 0.8)
    import psutil

    return int(psutil.virtual_memory().available * 0.8)


def _gpu_total_bytes() -> int | None:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return int(out.splitlines()[0].strip()) * MB
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def rss_bytes() -> int:
    """This process's resident memory (0 when psutil cannot say)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - informational only
        return 0
