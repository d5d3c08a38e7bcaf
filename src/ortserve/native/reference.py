"""A numpy twin of the native kernels' arithmetic (src/ortserve/native/csrc/kernels_*.c).

The C library reads GGUF weight blocks as the file holds them, quantizes each activation row into
int8 blocks and takes exact integer dot products per block; floats enter only as one product of
scales per block. This module does the same arithmetic in numpy so that the tests can say "the C
result equals this within float rounding", for every type and every instruction-set path:

- ``dequantize`` follows gguf-py's float operations, so it is bit-exact against it;
- ``quantize_act`` gives the same int8 values and scales as ``osg_quantize_act`` (bit-exact):
  per block of 32 (256 for K-quants) ``d = max|x| / 127``, ``q = rint(x * (1/d))``, in float32;
- ``swiglu`` is the op's optional SwiGLU of a [gate | up] row, in float32 (the C paths compute
  exp by a polynomial within a few ulp of it);
- ``matmul`` gives each output and the sum of the absolute per-block terms, the scale a tolerance
  for the order in which the C code sums floats is relative to.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 6, 7, 8, 12, 13, 14
IQ4_NL, IQ4_XS = 20, 23
BLOCK = {Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34),
         Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210), IQ4_NL: (32, 18), IQ4_XS: (256, 136)}
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0",
         Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS"}
# the sixteen non-linear values of IQ4_NL / IQ4_XS
KVALUES_IQ4 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32)
F32 = np.float32


def block_elems(t: int) -> int:
    return BLOCK[t][0]


def row_bytes(t: int, k: int) -> int:
    be, bb = BLOCK[t]
    return k // be * bb


@dataclass
class Decoded:
    """Integer weights of blocks (..., nb, elems) and their float parameters per block."""

    q: np.ndarray            # int32 quant values (unsigned except Q8_0 and Q6_K, which are signed)
    d: np.ndarray            # float32 scale per block
    m: np.ndarray | None     # Q4_1/Q5_1: float32 minimum; Q4_K/Q5_K: float32 dmin
    offset: int = 0          # Q4_0: 8, Q5_0: 16 (subtracted from q)
    sc: np.ndarray | None = None   # K-quants: int32 sub-block scales (8 or 16 per block)
    mn: np.ndarray | None = None   # Q4_K/Q5_K: int32 sub-block minimums (8 per block)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(F32)[..., 0]


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = s.astype(np.int32)
    lo = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi = ((s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4),
          (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4))
    return np.concatenate([lo[0], hi[0]], -1), np.concatenate([lo[1], hi[1]], -1)


def _nibbles32(qs: np.ndarray) -> np.ndarray:
    qs = qs.astype(np.int32)
    return np.concatenate([qs & 0x0F, qs >> 4], -1)


def _qh32(qh: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(qh).view(np.uint32)[..., 0:1].astype(np.int64)
    return ((bits >> np.arange(32)) & 1).astype(np.int32)


def decode(t: int, blocks: np.ndarray) -> Decoded:
    """Blocks as raw bytes (..., block_bytes) -> their integers and scales."""
    b = blocks
    if t == Q4_0:
        return Decoded(_nibbles32(b[..., 2:18]), _f16(b[..., 0:2]), None, 8)
    if t == Q4_1:
        return Decoded(_nibbles32(b[..., 4:20]), _f16(b[..., 0:2]), _f16(b[..., 2:4]))
    if t == Q5_0:
        return Decoded(_nibbles32(b[..., 6:22]) | (_qh32(b[..., 2:6]) << 4), _f16(b[..., 0:2]), None, 16)
    if t == Q5_1:
        return Decoded(_nibbles32(b[..., 8:24]) | (_qh32(b[..., 4:8]) << 4), _f16(b[..., 0:2]), _f16(b[..., 2:4]))
    if t == Q8_0:
        return Decoded(np.ascontiguousarray(b[..., 2:34]).view(np.int8).astype(np.int32), _f16(b[..., 0:2]), None)
    if t == IQ4_NL:
        return Decoded(KVALUES_IQ4[_nibbles32(b[..., 2:18])], _f16(b[..., 0:2]), None)
    if t == IQ4_XS:
        sh = np.ascontiguousarray(b[..., 2:4]).view(np.uint16)[..., 0:1].astype(np.int32)
        sl = b[..., 4:8].astype(np.int32)
        lo = np.stack([sl & 0x0F, sl >> 4], -1).reshape(*b.shape[:-1], 8)
        sc = (lo | (((sh >> (2 * np.arange(8))) & 3) << 4)) - 32
        q = KVALUES_IQ4[_nibbles32(b[..., 8:136].reshape(*b.shape[:-1], 8, 16))].reshape(*b.shape[:-1], 256)
        return Decoded(q, _f16(b[..., 0:2]), None, 0, sc)
    if t in (Q4_K, Q5_K):
        sc, mn = _scale_min_k4(b[..., 4:16])
        qs = b[..., -128:].astype(np.int32).reshape(*b.shape[:-1], 4, 1, 32)
        q = ((qs >> np.array([0, 4]).reshape(2, 1)) & 0x0F).reshape(*b.shape[:-1], 256)
        if t == Q5_K:
            qh = b[..., 16:48].astype(np.int32).reshape(*b.shape[:-1], 1, 32)
            q = q | (((qh >> np.arange(8).reshape(8, 1)) & 1) << 4).reshape(*b.shape[:-1], 256)
        return Decoded(q, _f16(b[..., 0:2]), _f16(b[..., 2:4]), 0, sc, mn)
    if t == Q6_K:
        ql = b[..., 0:128].astype(np.int32).reshape(*b.shape[:-1], 2, 1, 64)
        qh = b[..., 128:192].astype(np.int32).reshape(*b.shape[:-1], 2, 1, 32)
        lo = ((ql >> np.array([0, 4]).reshape(2, 1)) & 0x0F).reshape(*b.shape[:-1], 2, 128)
        hi = ((qh >> np.array([0, 2, 4, 6]).reshape(4, 1)) & 3).reshape(*b.shape[:-1], 2, 128)
        q = ((lo | (hi << 4)) - 32).reshape(*b.shape[:-1], 256)
        sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.int32)
        return Decoded(q, _f16(b[..., 208:210]), None, 0, sc)
    raise ValueError(f"unsupported ggml type {t}")


def _blocks(t: int, rows: np.ndarray | bytes, k: int) -> np.ndarray:
    be, bb = BLOCK[t]
    return np.frombuffer(bytes(rows), np.uint8).reshape(-1, k // be, bb)


def dequantize(t: int, rows: np.ndarray | bytes, k: int) -> np.ndarray:
    """(n, k) float32, with gguf-py's float operations (so bit-exact against it)."""
    x = decode(t, _blocks(t, rows, k))
    n = x.q.shape[0]
    if t in (Q4_0, Q5_0, Q8_0, IQ4_NL):
        out = x.d[..., None] * (x.q - x.offset).astype(F32)
    elif t in (Q4_1, Q5_1):
        out = x.d[..., None] * x.q.astype(F32) + x.m[..., None]
    elif t in (Q4_K, Q5_K):
        ds = (x.d[..., None] * x.sc.astype(F32))[..., None]
        dm = (x.m[..., None] * x.mn.astype(F32))[..., None]
        out = ds * x.q.reshape(*x.q.shape[:-1], 8, 32).astype(F32) - dm
    else:   # Q6_K: 16 groups of 16; IQ4_XS: 8 sub-blocks of 32
        g = x.sc.shape[-1]
        ds = (x.d[..., None] * x.sc.astype(F32))[..., None]
        out = ds * x.q.reshape(*x.q.shape[:-1], g, 256 // g).astype(F32)
    return out.reshape(n, k).astype(F32)


@dataclass
class Act:
    """Quantized activation rows: (m, nb) scales, (m, nb, elems) int8 values, (m, nb, groups) sums
    (one per 32-block, sixteen per 256-block: the sum of each 16). In the C layout of a 32-family row
    the nb scales come first, then the nb values of s, then the blocks of 32 int8."""

    d: np.ndarray
    q: np.ndarray
    sums: np.ndarray
    s: np.ndarray    # (m, nb) float32 d * sum of the block's values (the 32-families' minimum term)


def swiglu(x: np.ndarray) -> np.ndarray:
    """[m, 2k] rows of a gate then an up projection -> [m, k]: silu(gate) * up, in float32."""
    x = np.asarray(x, F32)
    gate, up = np.split(x, 2, axis=-1)
    with np.errstate(over="ignore"):
        return (gate * up / (F32(1) + np.exp(-gate))).astype(F32)


def quantize_act(t: int, x: np.ndarray) -> Act:
    be = block_elems(t)
    x = np.asarray(x, F32).reshape(x.shape[0], -1, be)
    amax = np.max(np.abs(x), axis=-1)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    q = np.clip(np.rint(x * inv[..., None]), -127, 127).astype(np.int32)
    groups = 1 if be == 32 else 16
    sums = q.reshape(*q.shape[:-1], groups, -1).sum(-1)
    return Act(d, q, sums, (d * sums[..., 0].astype(F32)).astype(F32))


def block_terms(t: int, x: Decoded, a: Act) -> np.ndarray:
    """(n, m, nb) float32: each block's contribution to each output, as the C code forms it."""
    ds = x.d[:, None, :] * a.d[None, :, :]                       # (n, m, nb) float32 scale products
    qa = np.einsum("nbe,mbe->nmb", x.q.astype(np.int64), a.q.astype(np.int64))
    if t in (Q4_0, Q5_0):
        return ds * (qa - x.offset * a.sums[None, :, :, 0]).astype(F32)
    if t in (Q8_0, IQ4_NL):
        return ds * qa.astype(F32)
    if t in (Q4_1, Q5_1):
        return ds * qa.astype(F32) + x.m[:, None, :] * a.s[None, :, :]
    n, nb = x.q.shape[:2]
    m = a.q.shape[0]
    if t in (Q4_K, Q5_K):
        qa8 = np.einsum("nbje,mbje->nmbj", x.q.reshape(n, nb, 8, 32).astype(np.int64),
                        a.q.reshape(m, nb, 8, 32).astype(np.int64))
        sumi = (qa8 * x.sc[:, None, :, :]).sum(-1)
        bs = a.sums.reshape(m, nb, 8, 2).sum(-1)
        summ = (x.mn[:, None, :, :] * bs[None, :, :, :]).sum(-1)
        dmin = x.m[:, None, :] * a.d[None, :, :]
        return ds * sumi.astype(F32) - dmin * summ.astype(F32)
    g = x.sc.shape[-1]      # Q6_K: 16 groups of 16; IQ4_XS: 8 sub-blocks of 32
    qag = np.einsum("nbge,mbge->nmbg", x.q.reshape(n, nb, g, 256 // g).astype(np.int64),
                    a.q.reshape(m, nb, g, 256 // g).astype(np.int64))
    return ds * (qag * x.sc[:, None, :, :]).sum(-1).astype(F32)


def abs_terms(t: int, x: Decoded, a: Act) -> np.ndarray:
    """(n, m, nb): a bound on the absolute values that any order of summing a block's products may
    pass through: |scales| times the sum of |weight| * |activation| per element, where a weight's
    offset (8, 16, 32 for Q6_K, 128 for Q8_0 as VNNI takes it unsigned: the SIMD paths apply it as a
    separate sum) counts on its own."""
    off = {Q4_0: 8, Q5_0: 16, Q6_K: 32, Q8_0: 128, IQ4_NL: 128}.get(t, 0)
    ds = np.abs(x.d[:, None, :] * a.d[None, :, :]).astype(np.float64)
    qa = np.abs(x.q).astype(np.float64) + off
    aa = np.abs(a.q).astype(np.float64)
    be = x.q.shape[-1]
    if x.sc is not None:   # the sub-block scales weigh each element's product
        per = be // x.sc.shape[-1]
        qa = qa * np.repeat(np.abs(x.sc), per, axis=-1)
    total = ds * np.einsum("nbe,mbe->nmb", qa, aa)
    if t in (Q4_1, Q5_1):
        total += np.abs(x.m[:, None, :] * a.d[None, :, :]) * aa.sum(-1)[None]
    if t in (Q4_K, Q5_K):
        mins = np.repeat(x.mn, 32, axis=-1).astype(np.float64)
        total += np.abs(x.m[:, None, :] * a.d[None, :, :]) * np.einsum("nbe,mbe->nmb", mins, aa)
    return total


def matmul(t: int, w: np.ndarray | bytes, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Y (m, n) = dot(W row n, quantized X row m), and (m, n) bounds of the absolute products summed
    (the scale of the float rounding by which the C code's order of summation may differ)."""
    x = np.asarray(x, F32)
    k = x.shape[1]
    dec, act = decode(t, _blocks(t, w, k)), quantize_act(t, x)
    terms = block_terms(t, dec, act)
    return terms.astype(np.float64).sum(-1).T, abs_terms(t, dec, act).sum(-1).T
