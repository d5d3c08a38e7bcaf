"""Streaming the GGUF's blocks into ONNX external data, one tensor (or row chunk) at a time.

The import of a multi-GB GGUF must not hold the whole model in memory (issue 31: the path
through transformers and the builder peaked at 20x the file). ``DataFile`` appends each
initializer's bytes to ``model.onnx.data`` as it is produced and hands back a TensorProto that
only points at them; ``NodeWeights`` decodes the rows of one graph node (a fused q/k/v or
gate/up node concatenates its tensors' rows) chunk by chunk, in a common bit width and group.

Each tensor's first rows are also dequantized by gguf's own reference code and compared with
the exact form, so a decoding error cannot pass silently (``Checks``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ortserve.errors import ModelError
from ortserve.models.gguf.reader import BLOCK_SIZES, FLOAT_TYPES, ExactForm, GGUFWeights, decode, pack_codes

ALIGN = 64                 # byte alignment of every initializer in the data file
CHUNK_WEIGHTS = 1 << 22    # weights decoded at once (~4M: tens of MB of temporaries)
CHECK_ROWS = 16            # rows of every tensor checked against gguf's dequantization
WEIGHT_RTOL = 1e-6


class DataFile:
    """model.onnx.data, written front to back; initializers refer to their byte ranges."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.f: BinaryIO = path.open("wb")
        self.pos = 0

    def close(self) -> None:
        self.f.close()

    def tensor(self, name: str, dims: list[int], dtype: Any, chunks: Iterator[np.ndarray] | np.ndarray) -> Any:
        """Write ``chunks`` (arrays of ``dtype`` whose bytes, in order, make the tensor) and
        return the TensorProto pointing at them."""
        from onnx import TensorProto, helper

        pad = -self.pos % ALIGN
        if pad:
            self.f.write(b"\0" * pad)
            self.pos += pad
        start = self.pos
        for c in [chunks] if isinstance(chunks, np.ndarray) else chunks:
            b = np.ascontiguousarray(c, dtype=dtype)
            self.f.write(b.tobytes(order="C"))  # tobytes: one chunk's copy, never the tensor's
            self.pos += b.nbytes
        want = int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize
        if self.pos - start != want:
            raise ModelError(f"{name}: wrote {self.pos - start} bytes, shape {dims} needs {want}")
        t = TensorProto()
        t.name = name
        t.dims.extend(dims)
        t.data_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.path.name), ("offset", str(start)), ("length", str(want))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return t


@dataclass
class Checks:
    """What the sampled checks against gguf's dequantization found."""

    max_error: float = 0.0
    tensors: int = 0
    types: dict[str, int] = field(default_factory=dict)

    def compare(self, weights: GGUFWeights, name: str, form: ExactForm, rows: int) -> None:
        """``form`` holds the first ``rows`` rows of tensor ``name`` in file order."""
        import gguf

        t = weights.tensors[name]
        cols = int(t.shape[0])
        per, size = BLOCK_SIZES[weights.qtype(name)]
        raw = np.asarray(t.data, np.uint8).reshape(-1)[: rows * cols // per * size]
        want = gguf.quants.dequantize(raw.reshape(rows, -1), t.tensor_type).astype(np.float64)
        got = form.dequantize()
        err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        self.max_error = max(self.max_error, err)
        self.tensors += 1
        self.types[weights.qtype(name)] = self.types.get(weights.qtype(name), 0) + 1
        if err > WEIGHT_RTOL:
            raise ModelError(f"exactness check failed: {name} ({weights.qtype(name)}) decodes {err:.3g} "
                             f"(relative) away from gguf's dequantization")


def tensor_rows(weights: GGUFWeights, name: str) -> tuple[int, int]:
    t = weights.tensors.get(name)
    if t is None:
        raise ModelError(f"{weights.path.name} has no tensor {name}")
    cols, rows = (int(x) for x in t.shape[:2])
    return rows, cols


def form_chunks(weights: GGUFWeights, name: str, checks: Checks) -> Iterator[ExactForm]:
    """The exact form of one quantized tensor, a few thousand rows at a time, rows as
    transformers has them (llama.cpp's Q/K permutation undone: those tensors come whole)."""
    rows, cols = tensor_rows(weights, name)
    qtype = weights.qtype(name)
    per, size = BLOCK_SIZES[qtype]
    perm = weights.row_permutation(name, rows)
    step = rows if perm is not None else max(1, min(rows, CHUNK_WEIGHTS // cols))
    raw = np.asarray(weights.tensors[name].data, np.uint8).reshape(rows, cols // per * size)
    for a in range(0, rows, step):
        form = decode(qtype, raw[a:a + step], min(step, rows - a), cols)
        if a == 0:
            checks.compare(weights, name, form.take_rows(np.arange(min(CHECK_ROWS, rows))), min(CHECK_ROWS, rows))
        release_pages(weights)
        yield form if perm is None else form.take_rows(perm)


def release_pages(weights: GGUFWeights) -> None:
    """Drop the GGUF pages read so far from this process's RSS (MADV_DONTNEED on the read-only
    file mapping: they stay in the page cache and fault back in if read again), so the
    import holds one chunk of the file, not all of it."""
    import mmap

    mm = getattr(getattr(weights.reader, "data", None), "_mmap", None)
    if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED)


def common_layout(weights: GGUFWeights, names: tuple[str, ...]) -> tuple[int, int, bool]:
    """(bits, group, has offsets) shared by the rows of ``names`` (widest bits, smallest group)."""
    bits, group, offsets = 0, 1 << 30, False
    for n in names:
        qt = weights.qtype(n)
        b, g, o = LAYOUTS[qt]
        bits, group, offsets = max(bits, b), min(group, g), offsets or o
    return bits, group, offsets


# GGML type -> (code bits, weights per scale, has a per-block minimum), as gguf_reader decodes it
LAYOUTS = {"Q4_0": (4, 32, False), "Q4_1": (4, 32, True), "Q5_0": (8, 32, False), "Q5_1": (8, 32, True),
           "Q8_0": (8, 32, False), "Q2_K": (4, 16, True), "Q3_K": (4, 16, False), "Q4_K": (4, 32, True),
           "Q5_K": (8, 32, True), "Q6_K": (8, 16, False), "IQ4_NL": (8, 32, False), "IQ4_XS": (8, 32, False)}


@dataclass
class NodeWeights:
    """The initializers of one MatMulNBits node made of the rows of ``names``."""

    codes: Any
    scales: Any
    offsets: Any | None       # [K/group, N] float32 (transposed for the minimum term), or None
    offsets_rows: Any | None  # [N, K/group] float32, kept only when asked (a tied embedding)
    n: int
    k: int
    bits: int
    group: int


def write_node(data: DataFile, weights: GGUFWeights, names: tuple[str, ...], base: str, checks: Checks,
               keep_offset_rows: bool = False) -> NodeWeights:
    """Stream the codes of ``names`` (rows concatenated) into ``data``; scales and offsets
    (1/8 of the codes or less) are gathered and written after them."""
    bits, group, has_off = common_layout(weights, names)
    shapes = [tensor_rows(weights, n) for n in names]
    k = shapes[0][1]
    if any(c != k for _, c in shapes):
        raise ModelError(f"{'+'.join(names)}: rows of different widths {shapes}")
    n = sum(r for r, _ in shapes)
    scales: list[np.ndarray] = []
    offsets: list[np.ndarray] = []

    def codes() -> Iterator[np.ndarray]:
        for name in names:
            for form in form_chunks(weights, name, checks):
                wide = form.widened(bits, group)
                scales.append(wide.scales)
                if has_off:
                    offsets.append(wide.offsets if wide.offsets is not None else np.zeros_like(wide.scales))
                yield pack_codes(wide)

    width = group * bits // 8
    codes_t = data.tensor(f"{base}.gguf_codes", [n, k // group, width], np.uint8, codes())
    scale_all = np.concatenate(scales)
    scales_t = data.tensor(f"{base}.gguf_scales", [n, k // group], np.float32, scale_all)
    off_t = rows = None
    if has_off:
        rows = np.concatenate(offsets)
        off_t = data.tensor(f"{base}.gguf_offsets", [k // group, n], np.float32, np.ascontiguousarray(rows.T))
    return NodeWeights(codes_t, scales_t, off_t, rows if keep_offset_rows else None, n, k, bits, group)


def dense_rows(weights: GGUFWeights, names: tuple[str, ...]) -> np.ndarray:
    """float32 [N, K] of float (or, for a mixed node, any) matrices, rows concatenated."""
    return np.concatenate([weights.dense(n).astype(np.float32) for n in names])


def is_float(weights: GGUFWeights, names: tuple[str, ...]) -> bool:
    return any(weights.qtype(n) in FLOAT_TYPES for n in names)


def vector(weights: GGUFWeights, name: str) -> np.ndarray:
    """A 1-D float tensor (norm weights, biases, rope factors) as float32."""
    import gguf

    t = weights.tensors.get(name)
    if t is None:
        raise ModelError(f"{weights.path.name} has no tensor {name}")
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(-1)
