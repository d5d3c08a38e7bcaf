"""Whisper's encoder and decoder on ONNX Runtime sessions of their own (the files og imported).

og's Generator runs the same two graphs, but its sessions always let their worker threads spin
between kernels, and og offers no way to turn that off. A decoder step is ~100 small kernels; on
cores shared with other work (chat engines beside, other jobs) the spinning threads take the CPU
the step needs: measured at load 17 on 2 cores, a step took 39.6 ms spinning and 26.5 ms not
(docs/audio.md). Here the sessions spin only when the machine is idle as the model loads (as
``engine/runtime.py`` decides for chat), the encoder's cross-attention keys and values stay bound to
the decoder for the whole window (no copy per step) and are reused by a temperature fallback, and
the self-attention cache passes from one step to the next as ONNX Runtime values, never through
numpy. The kernels, and so the logits, are ONNX Runtime's own either way (and the native Q8_0
kernels' where the import moved the MLP and the LM head onto them: the sessions register the
library the folder's ``genai_config.json`` names, as og does).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.native import register_custom_ops


def spinning_wanted(setting: bool | str = "auto", load: float | None = None, cores: int | None = None) -> bool:
    """``auto``: spin only when the machine is idle (load average under half the cores)."""
    if setting != "auto":
        return bool(setting)
    try:
        load = os.getloadavg()[0] if load is None else load
    except (OSError, AttributeError):
        return False
    return bool(load < 0.5 * (cores or os.cpu_count() or 1))


def session(path: Path, threads: int, spin: bool) -> Any:
    import onnxruntime as ort

    opts = register_custom_ops(ort.SessionOptions(), path.parent, path.stem)   # the folder's native kernels
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if threads > 0:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


class Runner:
    """The encoder once per window, then the decoder one token (or one prompt) at a time."""

    def __init__(self, model_dir: Path, layers: int, threads: int = 0, spin: bool | str = "auto") -> None:
        self.spin = spinning_wanted(spin)
        self.encoder = session(Path(model_dir) / "encoder.onnx", threads, self.spin)
        self.decoder = session(Path(model_dir) / "decoder.onnx", threads, self.spin)
        self.layers = layers
        self.cross_names = [f"present_{kv}_cross_{i}" for kv in ("key", "value") for i in range(layers)]
        self.outputs = [o.name for o in self.decoder.get_outputs()]
        ids = next(i for i in self.decoder.get_inputs() if i.name == "input_ids")
        self.id_type = np.int64 if ids.type == "tensor(int64)" else np.int32
        past = next(i for i in self.decoder.get_inputs() if i.name == "past_key_self_0")
        self.empty = np.zeros([1 if isinstance(d, str) else d for d in past.shape[:2]] + [0, past.shape[3]],
                              np.float32)

    def encode(self, features: np.ndarray) -> dict[str, np.ndarray]:
        """The window's cross-attention keys and values (``present_{key,value}_cross_<layer>``)."""
        out = self.encoder.run(self.cross_names, {"audio_features": features})
        return dict(zip(self.cross_names, out, strict=True))

    def start(self, cross: dict[str, np.ndarray]) -> Steps:
        return Steps(self, cross)


class Steps:
    """One decode of one window: ``feed`` tokens, get the last position's logits back."""

    def __init__(self, runner: Runner, cross: dict[str, np.ndarray]) -> None:
        import onnxruntime as ort

        self.r = runner
        self.binding = runner.decoder.io_binding()
        for name, value in cross.items():     # bound once: the decoder reads them in place every step
            self.binding.bind_ortvalue_input(name.replace("present_", "past_"), ort.OrtValue.ortvalue_from_numpy(value))
        self.past: dict[str, Any] = {f"past_{kv}_self_{i}": ort.OrtValue.ortvalue_from_numpy(runner.empty)
                                     for kv in ("key", "value") for i in range(runner.layers)}

    def feed(self, tokens: list[int]) -> np.ndarray:
        b = self.binding
        b.bind_cpu_input("input_ids", np.array([tokens], dtype=self.r.id_type))
        for name, value in self.past.items():
            b.bind_ortvalue_input(name, value)
        for name in self.r.outputs:
            b.bind_output(name)
        self.r.decoder.run_with_iobinding(b)
        out = dict(zip(self.r.outputs, b.get_outputs(), strict=True))
        self.past = {n.replace("present_", "past_"): v for n, v in out.items() if n.startswith("present_")}
        logits = out["logits"].numpy()
        return logits[0, -1]
