"""Reading GGUF matrices into the integer form MatMulNBits runs.

``GGUFWeights`` opens a file (gguf's memory-mapped reader), knows the architecture and
the llama.cpp Q/K row permutation, and decodes one tensor at a time; ``decode`` turns
the raw blocks of one tensor into an ``ExactForm``.

Every supported GGML block type is written exactly as

    w = scale * (code - 2**(bits-1)) + offset        (offset optional)

with unsigned ``bits``-bit codes (4 or 8; IQ4_NL/IQ4_XS's 4-bit indices into int8 levels
become 8-bit codes), one float32 scale per ``group`` weights along a row, and, for types with
a per-block minimum (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K), one float32 offset per group. The zero
point is always the MatMulNBits default (8 or 128), so graphs need no
zero-point input; minimums become the offset, which the graph adds as a separate term.

Scales are products of an fp16 and a small integer (exact in float32); offsets are a sum
of two such products, rounded once to float32. Byte lengths are checked before any view.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError

# GGML type name -> (weights per block, bytes per block)
BLOCK_SIZES: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
    "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
}
# IQ4_NL/IQ4_XS: a 4-bit index into these int8 levels (ggml's kvalues_iq4nl), so 8-bit codes
# level+128 hold them exactly.
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int16)
SUPPORTED = tuple(BLOCK_SIZES)
# Matrices the file keeps in float: they become plain fp32 MatMuls (exact, just larger).
FLOAT_TYPES = ("F32", "F16", "BF16")
# GGUF architectures with an exact import; True = llama.cpp permuted Q/K rows. phi3 and gemma2/3
# are written by the streamed path only (fast.streamable, families.py).
ARCHITECTURES = {"llama": True, "mistral": True, "qwen2": False, "qwen3": False,
                 "phi3": False, "gemma2": False, "gemma3": False}


class UnsupportedBlockType(ModelError):
    """A GGML type with no exact MatMulNBits form (the caller falls back to requantizing)."""


@dataclass
class ExactForm:
    """Rows of a weight matrix [N, K] as MatMulNBits codes: w = scale*(code - zp) + offset."""

    codes: np.ndarray            # uint8 [N, K], values < 2**bits
    scales: np.ndarray           # float32 [N, K // group]
    offsets: np.ndarray | None   # float32 [N, K // group] or None
    bits: int                    # 4 or 8
    group: int                   # 16 or 32

    @property
    def zero_point(self) -> int:
        return 1 << (self.bits - 1)

    def dequantize(self) -> np.ndarray:
        """float64 [N, K] (for checks; the graph never holds this)."""
        n, k = self.codes.shape
        c = self.codes.reshape(n, k // self.group, self.group).astype(np.float64) - self.zero_point
        w = c * self.scales[:, :, None].astype(np.float64)
        if self.offsets is not None:
            w += self.offsets[:, :, None]
        return w.reshape(n, k)

    def take_rows(self, rows: np.ndarray) -> ExactForm:
        off = None if self.offsets is None else self.offsets[rows]
        return ExactForm(self.codes[rows], self.scales[rows], off, self.bits, self.group)

    def widened(self, bits: int, group: int) -> ExactForm:
        """The same weights with more bits per code and/or smaller groups (both exact)."""
        if bits < self.bits or group > self.group or self.group % group:
            raise ValueError(f"cannot narrow {self.bits}-bit/{self.group} to {bits}-bit/{group}")
        codes = self.codes
        if bits != self.bits:
            codes = (codes.astype(np.int16) - self.zero_point + (1 << (bits - 1))).astype(np.uint8)
        rep = self.group // group
        scales = np.repeat(self.scales, rep, axis=1)
        off = None if self.offsets is None else np.repeat(self.offsets, rep, axis=1)
        return ExactForm(codes, scales, off, bits, group)


def concat_rows(forms: list[ExactForm]) -> ExactForm:
    """Stack row blocks (fused q/k/v or gate/up) in a common bit width and group size."""
    bits = max(f.bits for f in forms)
    group = min(f.group for f in forms)
    wide = [f.widened(bits, group) for f in forms]
    offsets = None
    if any(f.offsets is not None for f in wide):
        offsets = np.concatenate([f.offsets if f.offsets is not None else np.zeros_like(f.scales)
                                  for f in wide])
    return ExactForm(np.concatenate([f.codes for f in wide]), np.concatenate([f.scales for f in wide]),
                     offsets, bits, group)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] codes: low nibbles are weights 0-15, high ones 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes (a little-endian uint32) -> [n, 32] bits."""
    bits = np.ascontiguousarray(qh).view("<u4")[:, 0:1] >> np.arange(32, dtype=np.uint32)
    return (bits & 1).astype(np.uint8)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12-byte Q4_K/Q5_K field -> eight 6-bit scales and eight 6-bit minimums."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


# (codes [n, W], scales [n, G], offsets [n, G] or None, bits) for n blocks of W weights
Decoded = tuple[Any, Any, Any, int]


def _decode_blocks(qtype: str, b: np.ndarray) -> Decoded:
    """blocks [n, bytes] -> (codes [n, W], scales [n, G], offsets [n, G] | None, bits)."""
    if qtype == "Q4_0":
        return _nibbles(b[:, 2:]), _f16(b[:, 0:2])[:, None], None, 4
    if qtype == "Q4_1":
        d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        return _nibbles(b[:, 4:]), d[:, None], (m + 8.0 * d)[:, None], 4
    if qtype in ("Q5_0", "Q5_1"):
        body = 2 if qtype == "Q5_0" else 4
        q = _nibbles(b[:, body + 4:]) | (_high_bits(b[:, body:body + 4]) << 4)
        d = _f16(b[:, 0:2])[:, None]
        if qtype == "Q5_0":                       # d*(q-16): codes q-16+128
            return q + 112, d, None, 8
        return q + 128, d, _f16(b[:, 2:4])[:, None], 8
    if qtype == "Q8_0":                           # int8 q: codes q+128
        return b[:, 2:] ^ 0x80, _f16(b[:, 0:2])[:, None], None, 8
    if qtype in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
        sc, mn = _k_scale_min(b[:, 4:16])
        scale, minimum = d * sc, (dmin.astype(np.float64) * mn)
        if qtype == "Q4_K":
            qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
            q = (qs & 0x0F).reshape(-1, 256)
            return q, scale, (8.0 * scale - minimum).astype(np.float32), 4
        qh = b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        ql = b[:, 48:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        q = ((ql & 0x0F).reshape(-1, 8, 32) | ((qh & 1) << 4)).reshape(-1, 256)
        return q + 128, scale, (-minimum).astype(np.float32), 8
    if qtype == "Q2_K":                           # d*sc*q - dmin*m, 2-bit q, 16 weights per scale
        sc, d, dmin = b[:, 0:16], _f16(b[:, 80:82])[:, None], _f16(b[:, 82:84])[:, None]
        q2 = b[:, 16:80].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        scale = d * (sc & 0x0F).astype(np.float32)
        minimum = dmin.astype(np.float64) * (sc >> 4)
        return (q2 & 3).reshape(-1, 256), scale, (8.0 * scale - minimum).astype(np.float32), 4
    if qtype == "Q3_K":                           # d*(sc-32)*q, q in [-4, 3]: codes q+8
        lo = b[:, 96:104].reshape(-1, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)
        hi = b[:, 104:108].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)
        sc = ((lo.reshape(-1, 16) & 0x0F) | ((hi.reshape(-1, 16) & 0x03) << 4)).astype(np.float32) - 32
        q3 = b[:, 32:96].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        hbit = (b[:, 0:32].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
        q = (q3 & 3).reshape(-1, 256).astype(np.int16) - 4 * (1 - hbit.reshape(-1, 256).astype(np.int16))
        return q + 8, _f16(b[:, 108:110])[:, None] * sc, None, 4
    if qtype == "Q6_K":                           # d*sc*(q-32), 16 weights per scale
        lo = b[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        q6l = (lo & 0x0F).reshape(-1, 8, 32)
        hi = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        q = (q6l | ((hi & 0x03).reshape(-1, 8, 32) << 4)).reshape(-1, 256)
        sc = b[:, 192:208].view(np.int8).astype(np.float32)
        return q + 96, _f16(b[:, 208:210])[:, None] * sc, None, 8
    if qtype == "IQ4_NL":                         # d*level[q]: codes level+128
        return IQ4_LEVELS[_nibbles(b[:, 2:])] + 128, _f16(b[:, 0:2])[:, None], None, 8
    if qtype == "IQ4_XS":                         # d*(ls-32)*level[q], a 6-bit ls per 32 weights
        ib = np.arange(8)
        lo = (b[:, 4:8][:, ib // 2] >> (4 * (ib % 2)).astype(np.uint8)) & 0x0F
        hi = (np.ascontiguousarray(b[:, 2:4]).view("<u2") >> (2 * ib).astype(np.uint16)) & 3
        ls = (lo.astype(np.int16) | (hi.astype(np.int16) << 4)) - 32
        q = _nibbles(b[:, 8:].reshape(-1, 8, 16)).reshape(-1, 256)
        return IQ4_LEVELS[q] + 128, _f16(b[:, 0:2])[:, None] * ls.astype(np.float32), None, 8
    raise UnsupportedBlockType(f"GGML type {qtype} has no exact MatMulNBits form")


def decode(qtype: str, raw: np.ndarray, n_rows: int, n_cols: int) -> ExactForm:
    """GGUF tensor bytes (rows of blocks) -> ExactForm [n_rows, n_cols]."""
    if qtype not in BLOCK_SIZES:
        raise UnsupportedBlockType(f"GGML type {qtype} has no exact MatMulNBits form "
                                   f"(supported: {', '.join(SUPPORTED)})")
    per_block, nbytes = BLOCK_SIZES[qtype]
    if n_cols % per_block:
        raise ModelError(f"{qtype} row of {n_cols} weights is not a whole number of {per_block}-blocks")
    n_blocks = n_rows * (n_cols // per_block)
    flat = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if flat.size != n_blocks * nbytes:
        raise ModelError(f"{qtype} tensor [{n_rows}, {n_cols}] needs {n_blocks * nbytes} bytes, "
                         f"file has {flat.size}")
    codes, scales, offsets, bits = _decode_blocks(qtype, flat.reshape(n_blocks, nbytes))
    group = per_block // scales.shape[1]
    codes = codes.astype(np.uint8).reshape(n_rows, n_cols)
    scales = scales.astype(np.float32).reshape(n_rows, n_cols // group)
    if offsets is not None:
        offsets = offsets.astype(np.float32).reshape(n_rows, n_cols // group)
    return ExactForm(codes, scales, offsets, bits, group)


def pack_codes(form: ExactForm) -> np.ndarray:
    """[N, K] codes -> MatMulNBits B [N, K/group, group*bits/8] (4-bit: low nibble first)."""
    n, k = form.codes.shape
    c = form.codes.reshape(n, k // form.group, form.group)
    if form.bits == 8:
        return np.ascontiguousarray(c)
    return np.ascontiguousarray(c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


@dataclass
class GGUFWeights:
    """The 2-D quantized tensors of a GGUF file, decoded on demand."""

    path: Path
    arch: str
    n_head: int
    n_head_kv: int
    tensors: dict[str, Any] = field(default_factory=dict)   # name -> gguf ReaderTensor
    reader: Any = None                                       # the gguf.GGUFReader (metadata fields)

    @classmethod
    def open(cls, path: Path) -> GGUFWeights:
        from ortserve.models.gguf.opening import open_reader

        reader = open_reader(path)   # the vocabulary arrays skipped: seconds saved per open
        arch = _field(reader, "general.architecture")
        if arch not in ARCHITECTURES:
            raise UnsupportedBlockType(f"GGUF architecture {arch!r} is not mapped for exact import "
                                       f"(supported: {', '.join(ARCHITECTURES)})")
        heads = int(_field(reader, f"{arch}.attention.head_count"))
        kv = int(_field(reader, f"{arch}.attention.head_count_kv", heads))
        return cls(Path(path), arch, heads, kv, {t.name: t for t in reader.tensors}, reader)

    def qtype(self, name: str) -> str:
        return str(self.tensors[name].tensor_type.name)

    def form(self, name: str) -> ExactForm:
        t = self.tensors.get(name)
        if t is None:
            raise ModelError(f"{self.path.name} has no tensor {name}")
        cols, rows = (int(x) for x in t.shape[:2])
        f = decode(self.qtype(name), t.data, rows, cols)
        perm = self.row_permutation(name, rows)
        return f if perm is None else f.take_rows(perm)

    def dense(self, name: str) -> np.ndarray:
        """float64 [rows, cols] of any matrix, quantized or float, rows as transformers has them."""
        import gguf

        t = self.tensors[name]
        if self.qtype(name) not in FLOAT_TYPES:
            return self.form(name).dequantize()
        cols, rows = (int(x) for x in t.shape[:2])
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(rows, cols).astype(np.float64)
        perm = self.row_permutation(name, rows)
        return w if perm is None else w[perm]

    def row_permutation(self, name: str, rows: int) -> np.ndarray | None:
        """llama.cpp stores Q/K rows interleaved for its RoPE; transformers undoes it on load."""
        if not ARCHITECTURES[self.arch] or not re.search(r"\.attn_[qk]\.weight$", name):
            return None
        heads = self.n_head if ".attn_q." in name else self.n_head_kv
        idx = np.arange(rows).reshape(heads, rows // heads // 2, 2)
        return idx.swapaxes(2, 1).reshape(rows)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise ModelError(f"GGUF file lacks {key}")
        return default
    v = f.parts[f.data[0]]
    return bytes(v).decode() if v.dtype == np.uint8 else v[0]


def unsupported_tensors(weights: GGUFWeights) -> dict[str, str]:
    """Matrix weights whose block type has no exact form: name -> type."""
    out = {}
    for name in weights.tensors:
        if re.search(r"(^output|\.attn_[qkvo]\w*|\.ffn_(gate|up|down))\.weight$", name) or name == "output.weight":
            qt = weights.qtype(name)
            if qt not in SUPPORTED and qt not in FLOAT_TYPES:
                out[name] = qt
    return out


def count_types(nodes: list[dict[str, Any]]) -> dict[str, int]:
    """GGML type -> how many times a node's report (``{"gguf": [types]}``) names it."""
    return dict(Counter(t for n in nodes for t in n["gguf"]))


def exact_precision(weights: GGUFWeights) -> str:
    """The variant's precision label: the file's most common matrix block type (``q4_1``)."""
    kinds = Counter(weights.qtype(n) for n in weights.tensors
                    if n.startswith("blk.") and len(weights.tensors[n].shape) == 2)
    return kinds.most_common(1)[0][0].lower() if kinds else "gguf"


def requantizable_types() -> tuple[str, ...]:
    """Block types with no exact form that gguf can still dequantize (the re-quantizing path)."""
    import gguf

    traits = getattr(gguf.quants, "_type_traits", {})
    return tuple(sorted(t.name for t in traits if t.name not in SUPPORTED and t.name not in FLOAT_TYPES))


def refuse_unusable(weights: GGUFWeights) -> None:
    """Refuse, in seconds and before any heavy work, a file with a matrix in a type that
    neither the exact path nor the re-quantizing path can read; the error names both lists."""
    bad = {n: t for n, t in unsupported_tensors(weights).items() if t not in requantizable_types()}
    if bad:
        kinds = sorted(set(bad.values()))
        raise ModelError(f"{weights.path.name}: {len(bad)} weight(s) in {', '.join(kinds)}, which ortserve cannot "
                         f"read (exact: {', '.join(SUPPORTED + FLOAT_TYPES)}; re-quantized: "
                         f"{', '.join(requantizable_types())})",
                         hint="convert the file to one of those types, e.g. llama-quantize ... Q4_K_M")


def open_header(gguf_path: Path, architectures: Any) -> GGUFWeights:
    """The tensor table and metadata (memory-mapped, nothing decoded); refuses an architecture
    outside ``architectures`` or an unreadable block type, naming what is supported."""
    from ortserve.models.gguf.opening import open_reader

    reader = open_reader(gguf_path)
    arch = str(_field(reader, "general.architecture", ""))
    if arch not in architectures:
        raise ModelError(f"{Path(gguf_path).name}: GGUF architecture {arch or '(none)'!r} is not supported "
                         f"(supported: {', '.join(sorted(architectures))})",
                         hint="the architecture is in the file's general.architecture field")
    heads = int(_field(reader, f"{arch}.attention.head_count", 1))
    kv = int(_field(reader, f"{arch}.attention.head_count_kv", heads))
    weights = GGUFWeights(Path(gguf_path), arch, heads, kv, {t.name: t for t in reader.tensors}, reader)
    refuse_unusable(weights)
    return weights


def preflight(gguf_path: Path) -> GGUFWeights:
    """Open the file and refuse early (UnsupportedBlockType) if any matrix has no exact form."""
    weights = GGUFWeights.open(gguf_path)
    bad = unsupported_tensors(weights)
    if bad:
        kinds = sorted(set(bad.values()))
        raise UnsupportedBlockType(f"{gguf_path.name}: {len(bad)} weight(s) in {', '.join(kinds)}, "
                                   f"which have no exact MatMulNBits form (supported: {', '.join(SUPPORTED)})")
    return weights
