"""The vision encoder on onnxruntime, with its features cached by image hash.

og 0.18 runs the vision graph inside ``Generator.set_inputs`` and takes no precomputed features.
So ortserve runs the model's real encoder itself (one onnxruntime session), keeps each image's
features by the sha256 of its bytes, and gives og a pass-through vision graph (built in memory,
``Identity``) whose "pixel_values" are those features: a repeated image (an agent loop that sends
the same screenshot each turn) costs no encoder run, and og still places the features and computes
Qwen's mRoPE positions from ``image_grid_thw`` as before.

The encoder's threads run at a lower priority (``ENCODER_NICE``): an image's encoder run (seconds on
a few cores) shares the cores with the text and image rows decoding in the same batch, and at equal
priority two concurrent encodes with their own thread pools took ~5/6 of a 2-core machine from the
decode steps (text streams' token gap 6.5x idle beside 4 image clients, docs/vision.md). Niced, the
kernel's scheduler gives the decode threads the cores first (CFS weight 1024 against 110 at nice 10)
and the encoder the rest; on an idle machine nothing competes, so an image alone is encoded as fast.
The threads are ONNX Runtime's intra-op pool, created with the session (found as the threads that
appeared then, on Linux), and each worker thread that runs the encoder (never the main thread).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

PASSTHROUGH = "vision_passthrough.onnx"   # the in-memory graph og loads in place of the encoder
ENCODER_NICE = 10      # the encoder's threads' nice value: decode steps first, the encoder with what is left
_SPAWN = threading.Lock()   # one session created at a time while its new threads are told apart
_NICED = threading.local()


def _threads() -> set[int]:
    try:
        return {int(t.name) for t in Path("/proc/self/task").iterdir()}
    except (OSError, ValueError):   # not Linux: no per-thread priority here
        return set()


def lower_priority(tid: int, nice: int) -> bool:
    """Raise thread ``tid``'s nice value to ``nice`` (never lower it: that needs privileges); True if set."""
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        return True
    except (OSError, AttributeError):
        return False


def passthrough_graph(names: dict[str, str], out: str, width: int, merge: int) -> bytes:
    """An ONNX graph: image_features = pixel_values reshaped to [tokens, width]; the grid is taken, unused.

    og checks that "pixel_values" has one row per patch of ``image_grid_thw`` (and splits them per
    image by that count), so the features go in as [patches, width / merge^2], a reshape of
    [tokens, width] (one token per merge x merge patches), and come back out whole."""
    from onnx import TensorProto, helper

    pv, grid = names.get("pixel_values", "pixel_values"), names.get("image_grid_thw", "image_grid_thw")
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, width])
    graph = helper.make_graph(
        [helper.make_node("Reshape", [pv, "shape"], [out])], "vision_passthrough",
        [helper.make_tensor_value_info(pv, TensorProto.FLOAT, ["patches", width // (merge * merge)]),
         helper.make_tensor_value_info(grid, TensorProto.INT64, ["images", 3])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["image_tokens", width])], initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


class Encoder:
    """The real vision graph and the feature cache (least recently used out, past ``max_bytes``)."""

    def __init__(self, path: Path, names: dict[str, str], out: str, max_bytes: int = 256 << 20,
                 options: Any = None, nice: int | None = ENCODER_NICE) -> None:
        """``options``: onnxruntime SessionOptions (the server's threads and spinning); None: onnxruntime's own.
        ``nice``: the priority of the encoder's threads (None: as the process's)."""
        import onnxruntime as ort

        with _SPAWN:
            before = _threads()
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            self.pool = _threads() - before if before else set()
        self.nice = nice
        if nice is not None:
            for tid in self.pool:
                lower_priority(tid, nice)
        self.names, self.out = names, out
        self.max_bytes = max_bytes
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.bytes = 0
        self.runs = 0     # encoder runs (a cached image adds none)
        self.hits = 0
        self._lock = threading.Lock()
        self.takes_grid = self.names.get("image_grid_thw", "image_grid_thw") in {
            i.name for i in self.session.get_inputs()}
        width = self.session.get_outputs()[0].shape[-1]
        self.width = int(width) if isinstance(width, int) else 0

    def features(self, key: str, pixel_values: Any, grid: tuple[int, int, int]) -> np.ndarray:
        """One image's features; ``pixel_values`` is a callable run only on a cache miss."""
        with self._lock:
            if key and key in self.cache:
                self.cache.move_to_end(key)
                self.hits += 1
                return self.cache[key]
        feeds = {self.names.get("pixel_values", "pixel_values"): pixel_values()}
        if self.nice is not None and not getattr(_NICED, "done", False) and \
                threading.current_thread() is not threading.main_thread():   # it runs a share of the work too
            _NICED.done = lower_priority(threading.get_native_id(), self.nice)
        if self.takes_grid:   # Qwen's graph; Pixtral's (Mistral 3) reads the grid from the pixels' shape
            feeds[self.names.get("image_grid_thw", "image_grid_thw")] = np.asarray([grid], dtype=np.int64)
        out = self.session.run([self.out], feeds)[0].astype(np.float32, copy=False)
        with self._lock:
            self.runs += 1
            if key and out.nbytes <= self.max_bytes:
                self.cache[key] = out
                self.bytes += out.nbytes
                while self.bytes > self.max_bytes:
                    _, old = self.cache.popitem(last=False)
                    self.bytes -= old.nbytes
        return out
