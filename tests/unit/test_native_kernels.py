"""The native GGUF kernels (src/ortserve/native/csrc/kernels_*.c) against their numpy twin
(ortserve.native.reference) and against gguf-py's dequantization, on random blocks at odd shapes,
on every instruction-set path this CPU has (scalar, AVX2, AVX-512 VNNI, forced by osg_set_isa)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from ortserve.native import reference as ref

TYPES = [ref.Q4_0, ref.Q4_1, ref.Q5_0, ref.Q5_1, ref.Q8_0, ref.Q4_K, ref.Q5_K, ref.Q6_K, ref.IQ4_NL, ref.IQ4_XS]
ISAS = ["scalar", "avx2", "avx512"]
# byte offsets of the fp16 scale fields in each block
F16_FIELDS = {ref.Q4_0: [0], ref.Q4_1: [0, 2], ref.Q5_0: [0], ref.Q5_1: [0, 2], ref.Q8_0: [0],
              ref.Q4_K: [0, 2], ref.Q5_K: [0, 2], ref.Q6_K: [208], ref.IQ4_NL: [0], ref.IQ4_XS: [0]}


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The installed library when it is at least as new as every source, else the sources built
    into a temporary folder by the install's own build (same compiler flags, no -march: the SIMD
    paths are chosen at run time), so the tests never run a stale build."""
    from ortserve import native
    from ortserve.native import build

    path = native.library_path()
    if path is None or build.stale(path):
        result = build.build(tmp_path_factory.mktemp("osg"), force=True)
        if not result.ok:
            pytest.skip(result.reason)
        path = result.library
    so = ctypes.CDLL(str(path))
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    so.osg_row_bytes.restype = so.osg_act_row_bytes.restype = ctypes.c_size_t
    so.osg_row_bytes.argtypes = so.osg_act_row_bytes.argtypes = [ctypes.c_int, i64]
    so.osg_quantize_act.argtypes = [ctypes.c_int, vp, vp, i64]
    so.osg_dequant_row.argtypes = [ctypes.c_int, vp, vp, i64]
    so.osg_matmul_rows.argtypes = [ctypes.c_int, i64, vp, vp, i64, vp, i64, i64, i64]
    so.osg_swiglu.argtypes = [vp, vp, i64]
    so.osg_isa.restype = ctypes.c_char_p
    so.osg_set_isa.argtypes = [ctypes.c_char_p]
    return so


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest, lib: ctypes.CDLL):
    before = lib.osg_isa().decode()
    if lib.osg_set_isa(request.param.encode()) != 0:
        pytest.skip(f"this CPU has no {request.param}")
    yield request.param
    lib.osg_set_isa(b"avx512" if before == "avx512vnni" else before.encode())


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def random_weights(t: int, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """n rows of random blocks, the fp16 scale fields set to finite values of either sign."""
    be, bb = ref.BLOCK[t]
    w = rng.integers(0, 256, size=(n, k // be, bb), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        scale = (rng.uniform(0.002, 0.05, size=(n, k // be)) * rng.choice([-1, 1], size=(n, k // be)))
        w[..., off:off + 2] = scale.astype(np.float16)[..., None].view(np.uint8)
    return w.reshape(n, -1)


def random_acts(m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, rng.integers(0, k, size=3)] *= 20.0          # outliers, as real activations have
    x[0, :32] = 0.0                                   # an all-zero block: scale 0
    return x


def shape(t: int) -> int:
    """Odd block counts: 3 super-blocks, or 13 blocks (a group of 8 the SIMD paths take at once + 5)."""
    return 256 * 3 if ref.block_elems(t) == 256 else 32 * 13


def c_quantize(lib: ctypes.CDLL, t: int, x: np.ndarray) -> np.ndarray:
    m, k = x.shape
    ab = lib.osg_act_row_bytes(t, k)
    xq = np.zeros((m, ab), np.uint8)
    for i in range(m):
        lib.osg_quantize_act(t, _ptr(x[i]), _ptr(xq[i]), k)
    return xq


def test_sizes(lib: ctypes.CDLL) -> None:
    for t in TYPES:
        be, bb = ref.BLOCK[t]
        assert lib.osg_supported(t) == 1
        assert lib.osg_block_elems(t) == be
        assert lib.osg_row_bytes(t, be * 7) == bb * 7
        assert lib.osg_act_row_bytes(t, be * 7) == (40 if be == 32 else 292) * 7
    for t in (0, 1, 10, 16, 21, 24, 30, -1):
        assert lib.osg_supported(t) == 0 and lib.osg_row_bytes(t, 256) == 0


def test_isa_names(lib: ctypes.CDLL) -> None:
    assert lib.osg_isa().decode() in ("scalar", "avx2", "avx512vnni")
    assert lib.osg_set_isa(b"sse9") == -1
    assert lib.osg_set_isa(b"scalar") == 0 and lib.osg_isa() == b"scalar"
    lib.osg_set_isa(b"avx512") == 0 or lib.osg_set_isa(b"avx2")


def test_isa_env_lowers_the_level(lib: ctypes.CDLL) -> None:
    """ORTSERVE_NATIVE_ISA, read once at the first call, caps the level (a fresh process each)."""
    import subprocess
    import sys

    best = lib.osg_isa().decode()
    code = ("import ctypes, sys; so = ctypes.CDLL(sys.argv[1]); so.osg_isa.restype = ctypes.c_char_p; "
            "print(so.osg_isa().decode())")
    for env, want in (("scalar", "scalar"), ("avx2", "avx2" if best != "scalar" else "scalar"),
                      ("bogus", best)):
        out = subprocess.run([sys.executable, "-c", code, lib._name], env={"ORTSERVE_NATIVE_ISA": env},
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == want, (env, out)


def test_swiglu_is_within_a_few_ulp_of_float32_numpy(lib: ctypes.CDLL, isa: str) -> None:
    """silu(gate) * up over a [gate | up] row: the SIMD paths' polynomial exp against numpy's, from
    the far negative side (silu -> -0) through 0 to the far positive one (silu -> gate), and k not a
    multiple of the vector width (the tail takes expf)."""
    rng = np.random.default_rng(5)
    k = 8 * 300 + 5
    gate = np.concatenate([np.linspace(-120, 120, 1205, dtype=np.float32),
                           rng.standard_normal(k - 1205).astype(np.float32) * 4])
    x = np.concatenate([gate, rng.standard_normal(k).astype(np.float32)])
    h = np.full(k, np.nan, np.float32)
    lib.osg_swiglu(_ptr(x), _ptr(h), k)
    want = ref.swiglu(x[None])[0]
    assert np.isfinite(h).all()
    ulp = np.abs(h - want) / np.spacing(np.maximum(np.abs(want), np.float32(1e-30)))
    assert ulp.max() <= 4, (isa, float(ulp.max()), int(np.argmax(ulp)))


@pytest.mark.parametrize("t", [ref.Q4_0, ref.Q4_K])
def test_quantize_act_equals_reference(lib: ctypes.CDLL, isa: str, t: int) -> None:
    rng = np.random.default_rng(7)
    k = 256 * 3
    x = random_acts(3, k, rng)
    got = c_quantize(lib, t, x)
    want = ref.quantize_act(t, x)
    if ref.block_elems(t) == 32:   # per row: nb scales, nb scaled sums, then nb blocks of 32 int8
        nb = k // 32
        np.testing.assert_array_equal(got[:, :4 * nb].copy().view(np.float32), want.d)
        np.testing.assert_array_equal(got[:, 4 * nb:8 * nb].copy().view(np.float32), want.s)
        np.testing.assert_array_equal(got[:, 8 * nb:].view(np.int8).reshape(3, nb, 32), want.q)
    else:
        blocks = got.reshape(3, -1, 292)
        np.testing.assert_array_equal(blocks[..., 0:256].view(np.int8), want.q)
        np.testing.assert_array_equal(blocks[..., 256:288].copy().view(np.int16), want.sums)
        np.testing.assert_array_equal(blocks[..., 288:292].copy().view(np.float32)[..., 0], want.d)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: ref.NAMES[t])
@pytest.mark.parametrize("m", [1, 3, 9])
def test_matmul_equals_reference(lib: ctypes.CDLL, isa: str, t: int, m: int) -> None:
    rng = np.random.default_rng(1000 * t + m)
    k, n = shape(t), 7
    w = random_weights(t, n, k, rng)
    x = random_acts(m, k, rng)
    xq = c_quantize(lib, t, x)
    y = np.full((m, n + 2), np.nan, np.float32)         # ldy = n + 2: the padding stays untouched
    lib.osg_matmul_rows(t, k, _ptr(w), _ptr(xq), m, _ptr(y), n + 2, 0, n)
    want, scale = ref.matmul(t, w, x)
    err = np.abs(y[:, :n] - want)
    assert np.all(err <= 1e-6 * scale), (err / scale).max()
    assert np.isnan(y[:, n:]).all()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: ref.NAMES[t])
@pytest.mark.parametrize("m", [9, 17, 35, 67])
def test_many_rows_equal_reference(lib: ctypes.CDLL, isa: str, t: int, m: int) -> None:
    """More than 8 activation rows (the packed gemms: AVX-512, tiles of 8 rows, every type from 9; AVX2,
    tiles of 4 rows by half a panel): tiles and a remainder, a row range that starts and ends inside a
    panel of 16 weight rows (and inside its halves), ldy wider than N."""
    rng = np.random.default_rng(3000 * t + m)
    k, n, n0, n1 = shape(t), 41, 3, 38
    w = random_weights(t, n, k, rng)
    x = random_acts(m, k, rng)
    xq = c_quantize(lib, t, x)
    y = np.full((m, n + 2), np.nan, np.float32)
    lib.osg_matmul_rows(t, k, _ptr(w), _ptr(xq), m, _ptr(y), n + 2, n0, n1)
    want, scale = ref.matmul(t, w, x)
    err = np.abs(y[:, n0:n1] - want[:, n0:n1])
    assert np.all(err <= 1e-6 * scale[:, n0:n1]), (err / scale[:, n0:n1]).max()
    assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all()


# a byte that makes every weight the largest in magnitude its type has (Q8_0: -128, IQ4_NL: -127)
EXTREME = {ref.Q8_0: 0x80, ref.IQ4_NL: 0x00}


@pytest.mark.parametrize("t", TYPES, ids=lambda t: ref.NAMES[t])
def test_many_rows_at_the_saturation_bounds(lib: ctypes.CDLL, isa: str, t: int) -> None:
    """The largest weights times activations of 127 (every value of a row equal, of either sign): the
    int16 pairs (AVX2's vpmaddubsw, and the lines the AVX2 gemm adds as int16) must not saturate."""
    rng = np.random.default_rng(77 + t)
    k, n, m = shape(t), 19, 21
    w = np.full((n, k // ref.BLOCK[t][0], ref.BLOCK[t][1]), EXTREME.get(t, 0xFF), np.uint8)
    for off in F16_FIELDS[t]:
        w[..., off:off + 2] = np.float16(0.01).reshape(1).view(np.uint8)
    w = w.reshape(n, -1)
    x = np.where(np.arange(m)[:, None] % 2 == 0, 1.0, -1.0) * np.ones((m, k), np.float32)
    x[3] = rng.choice([-3.0, 3.0], size=k)                 # mixed signs, all |q| = 127
    xq = c_quantize(lib, t, x.astype(np.float32))
    y = np.full((m, n), np.nan, np.float32)
    lib.osg_matmul_rows(t, k, _ptr(w), _ptr(xq), m, _ptr(y), n, 0, n)
    want, scale = ref.matmul(t, w, x.astype(np.float32))
    assert np.all(np.abs(y - want) <= 1e-6 * scale), (np.abs(y - want) / scale).max()


@pytest.mark.parametrize("t", [ref.Q4_1, ref.Q6_K], ids=lambda t: ref.NAMES[t])
def test_matmul_row_range(lib: ctypes.CDLL, isa: str, t: int) -> None:
    rng = np.random.default_rng(5)
    k, n, m = shape(t), 9, 4
    w = random_weights(t, n, k, rng)
    x = random_acts(m, k, rng)
    xq = c_quantize(lib, t, x)  # held: a temporary's buffer would be freed before the call
    y = np.full((m, n), np.nan, np.float32)
    lib.osg_matmul_rows(t, k, _ptr(w), _ptr(xq), m, _ptr(y), n, 3, 6)
    want, scale = ref.matmul(t, w, x)
    assert np.all(np.abs(y[:, 3:6] - want[:, 3:6]) <= 1e-6 * scale[:, 3:6])
    assert np.isnan(y[:, :3]).all() and np.isnan(y[:, 6:]).all()


@pytest.mark.parametrize("t", [ref.Q8_0, ref.Q4_K], ids=lambda t: ref.NAMES[t])
def test_matmul_crosses_weight_chunks(lib: ctypes.CDLL, isa: str, t: int) -> None:
    """More weight rows than one 256 KB chunk, and activation tiles of 4 + 1: every output once."""
    rng = np.random.default_rng(11)
    k = ref.block_elems(t)
    n, m = (256 << 10) // ref.row_bytes(t, k) + 37, 5
    w = random_weights(t, n, k, rng)
    x = random_acts(m, k, rng)
    xq = c_quantize(lib, t, x)
    y = np.full((m, n), np.nan, np.float32)
    lib.osg_matmul_rows(t, k, _ptr(w), _ptr(xq), m, _ptr(y), n, 0, n)
    want, scale = ref.matmul(t, w, x)
    assert np.all(np.abs(y - want) <= 1e-6 * scale)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: ref.NAMES[t])
def test_dequant_row_is_gguf_py_exactly(lib: ctypes.CDLL, t: int) -> None:
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(t)
    k, n = shape(t), 3
    w = random_weights(t, n, k, rng)
    want = quants.dequantize(w, GGMLQuantizationType(t)).reshape(n, k)
    got = np.zeros((n, k), np.float32)
    for i in range(n):
        lib.osg_dequant_row(t, _ptr(w[i]), _ptr(got[i]), k)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ref.dequantize(t, w, k), want)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: ref.NAMES[t])
def test_reference_dot_is_dequantized_product(t: int) -> None:
    """The reference's integer arithmetic is the dequantized weights times the dequantized
    activations (so the kernels compute the matmul the model means, not only some product)."""
    rng = np.random.default_rng(3 + t)
    k = shape(t)
    w = random_weights(t, 5, k, rng)
    x = random_acts(2, k, rng)
    a = ref.quantize_act(t, x)
    xd = (a.d[..., None] * a.q).reshape(2, k).astype(np.float64)
    want = xd @ ref.dequantize(t, w, k).astype(np.float64).T
    got, scale = ref.matmul(t, w, x)
    assert np.all(np.abs(got - want) <= 1e-5 * scale)


def test_a_build_without_simd_is_the_scalar_path(tmp_path) -> None:
    """What a CPU other than x86 gets (the SIMD files compile to stubs): scalar, and still exact."""
    from ortserve.native import build

    result = build.build(tmp_path, force=True, extra_flags=["-DOSG_NO_SIMD", "-O1"])
    if not result.ok:
        pytest.skip(result.reason)
    so = ctypes.CDLL(str(result.library))
    so.osg_isa.restype = ctypes.c_char_p
    so.osg_set_isa.argtypes = [ctypes.c_char_p]
    so.osg_act_row_bytes.restype = ctypes.c_size_t
    so.osg_act_row_bytes.argtypes = [ctypes.c_int, ctypes.c_int64]
    so.osg_quantize_act.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    so.osg_matmul_rows.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    assert so.osg_isa() == b"scalar" and so.osg_set_isa(b"avx2") == -1
    rng = np.random.default_rng(2)
    for t in (ref.Q4_1, ref.Q4_K):
        k, n, m = shape(t), 5, 2
        w = random_weights(t, n, k, rng)
        x = random_acts(m, k, rng)
        xq = c_quantize(so, t, x)
        y = np.zeros((m, n), np.float32)
        so.osg_matmul_rows(t, k, _ptr(w), _ptr(xq), m, _ptr(y), n, 0, n)
        want, scale = ref.matmul(t, w, x)
        assert np.all(np.abs(y - want) <= 1e-6 * scale)
