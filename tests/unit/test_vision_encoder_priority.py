"""The vision encoder yields the cores to decode steps (vision/features.py): the intra-op threads its
session creates, and each worker thread that runs it, get a higher nice value; the main thread and
the other threads of the process keep theirs (Linux: per-thread priorities)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortserve.vision.features import ENCODER_NICE, Encoder

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def _graph(path: Path) -> None:
    g = helper.make_graph([helper.make_node("Relu", ["pixel_values"], ["image_features"])], "vision",
                          [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["n", 4])],
                          [helper.make_tensor_value_info("image_features", TensorProto.FLOAT, ["n", 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_the_encoders_threads_are_niced_and_nobody_else(tmp_path: Path) -> None:
    _graph(tmp_path / "vision.onnx")
    others = {int(t.name): _nice(int(t.name)) for t in Path("/proc/self/task").iterdir()}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 3                         # two pool threads besides the caller
    enc = Encoder(tmp_path / "vision.onnx", {}, "image_features", options=opts)
    # ONNX Runtime's two pool threads (a thread some other code started in the same moment would be
    # counted, and niced, too: at least two, none of those that were there before)
    assert len(enc.pool) >= 2 and not enc.pool & set(others)
    assert all(_nice(t) >= ENCODER_NICE for t in enc.pool)
    assert {t: _nice(t) for t in others if Path(f"/proc/self/task/{t}").exists()} == \
        {t: n for t, n in others.items() if Path(f"/proc/self/task/{t}").exists()}

    x = np.array([[1.0, -2.0, 3.0, -4.0]], np.float32)
    assert np.array_equal(enc.features("", lambda: x, (1, 1, 1)), np.maximum(x, 0))   # the main thread: kept
    assert _nice(threading.get_native_id()) == others[threading.get_native_id()]
    seen: dict[str, int] = {}

    def worker() -> None:
        enc.features("", lambda: x, (1, 1, 1))
        seen["nice"] = _nice(threading.get_native_id())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["nice"] >= ENCODER_NICE                   # a prep thread that ran it yields too
    assert enc.runs == 2


def test_no_nice_leaves_every_thread_as_it_was(tmp_path: Path) -> None:
    _graph(tmp_path / "vision.onnx")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    base = _nice(threading.get_native_id())
    enc = Encoder(tmp_path / "vision.onnx", {}, "image_features", options=opts, nice=None)
    assert enc.pool and all(_nice(t) == base for t in enc.pool)
