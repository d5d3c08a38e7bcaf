"""Where the KV cache lives: host memory (numpy) or the session's device (OrtValues).

Both keep one buffer per layer and kind, ``[rows, kv_heads, capacity, head_size]``, and
hand the runner raw pointers: a row range is contiguous (rows are the leading axis), so
binding rows ``a..b`` as past *and* present is pointer arithmetic, and GroupQueryAttention
writes the new keys in place.

- ``HostKV`` is for the CPU provider: numpy arrays, rows copied with numpy.
- ``DeviceKV`` is for CUDA/DirectML: the buffers are allocated on the device and never leave
  it. A step sends only token ids and the mask and reads back only the logits. Moving a row
  (compaction when a sequence retires) and growing the cache run as two tiny ONNX graphs
  (Identity, Pad) on the same provider, so the copies are device-to-device. The same code
  runs on the CPU provider, which is how CI tests it.

Compaction rather than holes: a retired row costs one copy of one row, once; a hole left in
the batch would cost a wasted row of attention and matmul on every later step.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import numpy as np

_ORT_DEVICE = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda",
               "DmlExecutionProvider": "dml"}


def device_of(provider: Any) -> str:
    name = provider[0] if isinstance(provider, tuple) else provider
    return _ORT_DEVICE.get(str(name), "cpu")


class HostKV:
    """The KV cache in host memory (numpy): for the CPU provider."""

    device = "cpu"

    def __init__(self, n_buffers: int, dtype: Any) -> None:
        self.n = n_buffers
        self.dtype = np.dtype(dtype)
        self.bufs: list[np.ndarray] = []
        self.shape: tuple[int, ...] = (0, 0, 0, 0)

    def allocate(self, shape: tuple[int, int, int, int], keep_rows: int, keep_tokens: int) -> None:
        new = [np.zeros(shape, dtype=self.dtype) for _ in range(self.n)]
        for old, buf in zip(self.bufs, new):
            buf[:keep_rows, :, :keep_tokens] = old[:keep_rows, :, :keep_tokens]
        self.bufs, self.shape = new, shape

    def release(self) -> None:
        self.bufs, self.shape = [], (0, 0, 0, 0)

    def pointer(self, i: int, row: int) -> int:
        return int(self.bufs[i].ctypes.data) + row * self.row_bytes

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:])) * self.dtype.itemsize

    def move_row(self, src: int, dst: int, tokens: int) -> None:
        for buf in self.bufs:
            buf[dst, :, :tokens] = buf[src, :, :tokens]

    def row(self, i: int, row: int) -> np.ndarray:
        """A host copy of one row of buffer ``i`` (tests compare placements with it)."""
        return np.array(self.bufs[i][row])

    def save(self, row: int, tokens: int) -> list[np.ndarray]:
        """The first ``tokens`` of ``row`` in every buffer, ``[kv_heads, tokens, head_size]`` each:
        views of ONE array. A prefix-cache entry is then a single allocation (past glibc's mmap
        threshold from ~12 tokens of a small model, so it is unmapped whole at eviction), not 2 x layers
        small ones that live for minutes among short-lived ones and fragment the arena: the one-hour
        soak's growth (docs/robustness.md)."""
        _, h, _, d = self.shape
        block = np.empty((self.n, h, tokens, d), dtype=self.dtype)
        for i, buf in enumerate(self.bufs):
            block[i] = buf[row, :, :tokens]
        return list(block)

    def load(self, block: list[np.ndarray], row: int, tokens: int) -> None:
        for buf, saved in zip(self.bufs, block):
            buf[row, :, :tokens] = saved[:, :tokens]


class DeviceKV:
    """The KV cache as OrtValues on the session's device, copied there by tiny graphs."""

    def __init__(self, n_buffers: int, dtype: Any, device: str, providers: list[Any], device_id: int = 0) -> None:
        import onnxruntime as ort

        self.n = n_buffers
        self.dtype = np.dtype(dtype)
        self.device = device
        self.device_id = device_id
        self.bufs: list[Any] = []
        self.shape: tuple[int, ...] = (0, 0, 0, 0)
        kind = "f16" if self.dtype == np.float16 else "f32"
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self._copy = ort.InferenceSession(_graph(f"kv_copy_{kind}.onnx"), so, providers=providers)
        self._pad = ort.InferenceSession(_graph(f"kv_pad_{kind}.onnx"), so, providers=providers)
        self._ort = ort

    def allocate(self, shape: tuple[int, int, int, int], keep_rows: int, keep_tokens: int) -> None:
        alloc = self._ort.OrtValue.ortvalue_from_shape_and_type
        new = [alloc(list(shape), self.dtype, self.device, self.device_id) for _ in range(self.n)]
        if self.bufs and keep_rows and keep_tokens:
            # the kept block, re-laid out at the new row stride and zero-padded on the device
            _, h, c, d = self.shape
            old_view = (keep_rows, h, c, d)
            # a negative end pad crops: capacity only shrinks down to what the rows still hold
            pads = np.array([0, 0, 0, 0, shape[0] - keep_rows, 0, shape[2] - c, 0], dtype=np.int64)
            for old, buf in zip(self.bufs, new):
                io = self._pad.io_binding()
                io.bind_input("x", self.device, self.device_id, self.dtype, old_view, old.data_ptr())
                io.bind_cpu_input("pads", pads)
                io.bind_output("y", self.device, self.device_id, self.dtype, list(shape), buf.data_ptr())
                self._pad.run_with_iobinding(io)
        else:
            self._zero(new, shape)
        self.bufs, self.shape = new, shape

    def _zero(self, bufs: list[Any], shape: tuple[int, ...]) -> None:
        """Fresh device memory is uninitialised: pad an empty block into it."""
        empty = np.zeros((0, *shape[1:]), dtype=self.dtype)
        pads = np.array([0, 0, 0, 0, shape[0], 0, 0, 0], dtype=np.int64)
        for buf in bufs:
            io = self._pad.io_binding()
            io.bind_cpu_input("x", empty)
            io.bind_cpu_input("pads", pads)
            io.bind_output("y", self.device, self.device_id, self.dtype, list(shape), buf.data_ptr())
            self._pad.run_with_iobinding(io)

    def release(self) -> None:
        self.bufs, self.shape = [], (0, 0, 0, 0)

    def pointer(self, i: int, row: int) -> int:
        return int(self.bufs[i].data_ptr()) + row * self.row_bytes

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:])) * self.dtype.itemsize

    def move_row(self, src: int, dst: int, tokens: int) -> None:
        # the whole row: its positions past ``tokens`` are masked out, and one contiguous copy
        # per buffer beats kv_heads strided ones
        shape = [1, *self.shape[1:]]
        for i in range(self.n):
            io = self._copy.io_binding()
            io.bind_input("x", self.device, self.device_id, self.dtype, shape, self.pointer(i, src))
            io.bind_output("y", self.device, self.device_id, self.dtype, shape, self.pointer(i, dst))
            self._copy.run_with_iobinding(io)

    def row(self, i: int, row: int) -> np.ndarray:
        io = self._copy.io_binding()
        shape = [1, *self.shape[1:]]
        io.bind_input("x", self.device, self.device_id, self.dtype, shape, self.pointer(i, row))
        io.bind_output("y", "cpu")
        self._copy.run_with_iobinding(io)
        return np.asarray(io.get_outputs()[0].numpy()[0])


    def save(self, row: int, tokens: int) -> list[Any]:
        """The first ``tokens`` of ``row`` in every buffer, as new device values ``[1, kv_heads,
        tokens, head_size]``: the Pad graph with a negative end pad crops the row on the device."""
        _, h, c, d = self.shape
        pads = np.array([0, 0, 0, 0, 0, 0, tokens - c, 0], dtype=np.int64)
        alloc = self._ort.OrtValue.ortvalue_from_shape_and_type
        out = [alloc([1, h, tokens, d], self.dtype, self.device, self.device_id) for _ in range(self.n)]
        for i, dst in enumerate(out):
            self._pad_run([1, h, c, d], self.pointer(i, row), pads, [1, h, tokens, d], dst.data_ptr())
        return out

    def load(self, block: list[Any], row: int, tokens: int) -> None:
        """A saved block into ``row``, padded (or cropped) to the row's capacity; positions past
        ``tokens`` are beyond the row's length, so what lands there is never read."""
        _, h, c, d = self.shape
        for i, saved in enumerate(block):
            n = saved.shape()[2]
            pads = np.array([0, 0, 0, 0, 0, 0, c - n, 0], dtype=np.int64)
            self._pad_run([1, h, n, d], saved.data_ptr(), pads, [1, h, c, d], self.pointer(i, row))

    def _pad_run(self, x_shape: list[int], x_ptr: int, pads: np.ndarray, y_shape: list[int], y_ptr: int) -> None:
        io = self._pad.io_binding()
        io.bind_input("x", self.device, self.device_id, self.dtype, x_shape, x_ptr)
        io.bind_cpu_input("pads", pads)
        io.bind_output("y", self.device, self.device_id, self.dtype, y_shape, y_ptr)
        self._pad.run_with_iobinding(io)


def _graph(name: str) -> bytes:
    return resources.files("ortserve").joinpath("data", name).read_bytes()


def make_graphs() -> dict[str, bytes]:
    """The tiny copy/pad graphs (needs the `onnx` package; their bytes ship in ortserve/data)."""
    from onnx import TensorProto, helper

    out = {}
    for kind, elem in (("f32", TensorProto.FLOAT), ("f16", TensorProto.FLOAT16)):
        for op in ("copy", "pad"):
            x = helper.make_tensor_value_info("x", elem, ["r", "h", "c", "d"])
            y = helper.make_tensor_value_info("y", elem, ["r2", "h", "c2", "d"])
            if op == "copy":
                nodes, inputs = [helper.make_node("Identity", ["x"], ["y"])], [x]
            else:
                pads = helper.make_tensor_value_info("pads", TensorProto.INT64, [8])
                nodes, inputs = [helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")], [x, pads]
            model = helper.make_model(helper.make_graph(nodes, f"kv_{op}", inputs, [y]),
                                      opset_imports=[helper.make_opsetid("", 18)], producer_name="ortserve")
            model.ir_version = 8
            out[f"kv_{op}_{kind}.onnx"] = model.SerializeToString()
    return out
