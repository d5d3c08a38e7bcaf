"""The ortserve.gguf custom ops in a real onnxruntime.InferenceSession, against the numpy twin of the
kernels' arithmetic (native/reference.py): every type, odd shapes, 1 and 2 intra-op threads.

Running them through ONNX Runtime is also what checks the project's own ABI header
(csrc/ort_abi.h): a wrong slot index calls the wrong function and fails here.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortserve import native
from ortserve.native import build as native_build
from ortserve.native import reference as ref

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the library builds on Linux")

# offsets of the fp16 scale fields in each block (random bytes there could be inf or NaN)
F16_FIELDS = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}
TYPES = sorted(native.SUPPORTED_TYPES)


@pytest.fixture(scope="module")
def library():
    """The library, rebuilt first when missing or older than its sources (a clean clone after
    `make install` has it; a developer who edited csrc/ gets a fresh one)."""
    result = native_build.build()
    assert result.ok, result.reason
    native._status.cache_clear()
    return result.library


def random_weights(t: int, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    be, bb = ref.BLOCK[t]
    w = rng.integers(0, 256, size=(n, k // be, bb), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        scale = rng.uniform(0.002, 0.05, size=(n, k // be)) * rng.choice([-1, 1], size=(n, k // be))
        w[..., off:off + 2] = scale.astype(np.float16)[..., None].view(np.uint8)
    return w.reshape(n, -1)


def width(t: int) -> int:
    return 256 * 2 if ref.block_elems(t) == 256 else 32 * 5


def model(node: helper.NodeProto, inputs: list, name: str = "Y") -> bytes:
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(native.DOMAIN, native.OPSET)]
                             ).SerializeToString()


def session(library, graph: bytes, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(library))
    return ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])


def matmul_model(t: int, k: int, n: int, x_shape: list | None = None, w_shape: list | None = None,
                 **attrs) -> bytes:
    node = helper.make_node(native.MATMUL_OP, ["X", "W"], ["Y"], domain=native.DOMAIN, ggml_type=t, K=k, N=n,
                            **attrs)
    w_shape = w_shape or [n, native.row_bytes(t, k)]
    return model(node, [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape or [None, k]),
                        helper.make_tensor_value_info("W", TensorProto.UINT8, w_shape)])


def gather_model(t: int, k: int, v: int) -> bytes:
    node = helper.make_node(native.GATHER_OP, ["W", "ids"], ["Y"], domain=native.DOMAIN, ggml_type=t, K=k, V=v)
    return model(node, [helper.make_tensor_value_info("W", TensorProto.UINT8, [v, native.row_bytes(t, k)]),
                        helper.make_tensor_value_info("ids", TensorProto.INT64, None)])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("t", TYPES, ids=[ref.NAMES[t] for t in TYPES])
def test_matmul_equals_the_reference(library, t, threads):
    rng = np.random.default_rng(t * 10 + threads)
    k, n = width(t), 37  # N odd and not a multiple of any chunk
    w = random_weights(t, n, k, rng)
    sess = session(library, matmul_model(t, k, n), threads)
    for m in (1, 3, 9, 17, 67):  # 67: past one task's 64 rows, an odd tile of the many-row path
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[:, rng.integers(0, k, size=3)] *= 20.0  # outliers, as real activations have
        (y,) = sess.run(None, {"X": x, "W": w})
        want, scale = ref.matmul(t, w, x)
        assert y.shape == (m, n) and y.dtype == np.float32
        np.testing.assert_array_less(np.abs(y - want), 1e-5 * scale + 1e-6, err_msg=f"M={m}")


@pytest.mark.parametrize("t", [8, 12, 14], ids=["Q8_0", "Q4_K", "Q6_K"])
def test_swiglu_matmul_multiplies_silu_of_the_gate_by_the_up(library, t):
    """swiglu=1: X is [..., 2K], a gate then an up projection; Y = (silu(gate) * up) @ W^T, the
    SwiGLU taken as each row is quantized (one row in the calling thread, many on the pool)."""
    lib = native._load(library)
    lib.osg_swiglu.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    rng = np.random.default_rng(20 + t)
    k, n = width(t), 37
    w = random_weights(t, n, k, rng)
    sess = session(library, matmul_model(t, k, n, ["b", "s", 2 * k], swiglu=1), 2)
    assert sess.get_outputs()[0].shape == ["b", "s", n]
    for m in (1, 9, 67):
        x = (rng.standard_normal((1, m, 2 * k)) * 3).astype(np.float32)
        (y,) = sess.run(None, {"X": x, "W": w})
        h = np.empty((m, k), np.float32)   # the library's own SwiGLU (its ulp are tested in test_native_kernels)
        for i in range(m):
            lib.osg_swiglu(x[0, i].ctypes.data, h[i].ctypes.data, k)
        np.testing.assert_allclose(h, ref.swiglu(x[0]), rtol=1e-5, atol=1e-30)
        want, scale = ref.matmul(t, w, h)
        assert y.shape == (1, m, n)
        np.testing.assert_array_less(np.abs(y[0] - want), 1e-5 * scale + 1e-6, err_msg=f"M={m}")


def test_swiglu_wants_twice_k_and_a_flag(library):
    t, k, n = 8, 64, 5
    w = random_weights(t, n, k, np.random.default_rng(0))
    sess = session(library, matmul_model(t, k, n, [None, None], swiglu=1), 1)
    with pytest.raises(Exception, match=r"X's last dimension must be 2K \(swiglu: gate and up\)=128"):
        sess.run(None, {"X": np.zeros((1, k), np.float32), "W": w})
    with pytest.raises(Exception, match="swiglu=2 must be 0 or 1"):
        session(library, matmul_model(t, k, n, swiglu=2), 1)


def test_matmul_keeps_leading_dimensions_and_many_rows(library):
    t, k, n = 12, 256, 200  # N beyond one chunk of rows; M beyond the decode sizes
    rng = np.random.default_rng(7)
    w = random_weights(t, n, k, rng)
    x = rng.standard_normal((2, 33, k)).astype(np.float32)
    (y,) = session(library, matmul_model(t, k, n, [2, None, k]), 2).run(None, {"X": x, "W": w})
    want, scale = ref.matmul(t, w, x.reshape(-1, k))
    assert y.shape == (2, 33, n)
    np.testing.assert_array_less(np.abs(y.reshape(-1, n) - want), 1e-5 * scale + 1e-6)


def test_matmul_with_no_rows(library):
    t, k, n = 8, 64, 5
    w = random_weights(t, n, k, np.random.default_rng(1))
    (y,) = session(library, matmul_model(t, k, n), 2).run(None, {"X": np.zeros((0, k), np.float32), "W": w})
    assert y.shape == (0, n)


@pytest.mark.parametrize("t", TYPES, ids=[ref.NAMES[t] for t in TYPES])
def test_gather_is_exact(library, t):
    rng = np.random.default_rng(t)
    k, v = width(t), 11
    w = random_weights(t, v, k, rng)
    ids = np.array([[10, 0, 3], [3, 3, 7]], np.int64)
    (y,) = session(library, gather_model(t, k, v), 2).run(None, {"W": w, "ids": ids})
    assert y.shape == (2, 3, k)
    np.testing.assert_array_equal(y, ref.dequantize(t, w, k)[ids])


def test_gather_of_many_rows_in_parallel(library):
    t, k, v = 12, 256, 50  # 300 rows of 256: past the size gathered in the calling thread
    rng = np.random.default_rng(3)
    w = random_weights(t, v, k, rng)
    ids = rng.integers(0, v, size=(3, 100), dtype=np.int64)
    (y,) = session(library, gather_model(t, k, v), 2).run(None, {"W": w, "ids": ids})
    np.testing.assert_array_equal(y, ref.dequantize(t, w, k)[ids])


@pytest.mark.parametrize("bad", [11, -1])
def test_gather_refuses_ids_out_of_range(library, bad):
    t, k, v = 8, 32, 11
    w = random_weights(t, v, k, np.random.default_rng(0))
    sess = session(library, gather_model(t, k, v), 1)
    with pytest.raises(Exception, match=rf"GgufGather: id {bad} at position 1 is outside \[0, 11\)"):
        sess.run(None, {"W": w, "ids": np.array([1, bad], np.int64)})


def test_shapes_that_disagree_with_the_attributes_are_errors(library):
    t, k, n = 8, 64, 5
    w = random_weights(t, n, k, np.random.default_rng(0))
    sess = session(library, matmul_model(t, k, n, [None, None], [None, None]), 1)
    with pytest.raises(Exception, match="X's last dimension must be K=64"):
        sess.run(None, {"X": np.zeros((1, 32), np.float32), "W": w})
    sess = session(library, matmul_model(t, k, n + 1, [None, k], [None, None]), 1)
    with pytest.raises(Exception, match=r"W must be \[N=6, 68\]"):
        sess.run(None, {"X": np.zeros((1, k), np.float32), "W": w})


@pytest.mark.parametrize(("attrs", "message"), [
    ({"ggml_type": 1, "K": 64, "N": 4}, "ggml type 1 is not supported"),
    ({"ggml_type": 12, "K": 64, "N": 4}, "K=64 is not a positive multiple of 256"),
    ({"ggml_type": 8, "K": 64, "N": 0}, "N=0 must be positive"),
    ({"ggml_type": 8, "K": 64}, "missing int attribute 'N'"),
])
def test_bad_attributes_fail_when_the_session_is_made(library, attrs, message):
    node = helper.make_node(native.MATMUL_OP, ["X", "W"], ["Y"], domain=native.DOMAIN, **attrs)
    graph = model(node, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 64]),
                         helper.make_tensor_value_info("W", TensorProto.UINT8, [None, None])])
    with pytest.raises(Exception, match=message):
        session(library, graph, 1)


@pytest.fixture(params=["scalar", "avx2", "avx512"])
def isa(request, library):
    """Each instruction-set path the CPU has, chosen in the library ONNX Runtime runs (the same
    loaded object as ctypes': one path per process), the CPU's best restored after."""
    lib = native._load(library)
    before = lib.osg_isa().decode()
    if lib.osg_set_isa(request.param.encode()) != 0:
        pytest.skip(f"this CPU has no {request.param}")
    yield request.param
    lib.osg_set_isa(b"avx512" if before == "avx512vnni" else before.encode())


@pytest.mark.parametrize("t", TYPES, ids=[ref.NAMES[t] for t in TYPES])
def test_every_isa_path_through_the_session(library, isa, t):
    rng = np.random.default_rng(100 + t)
    k, n = width(t), 45
    w = random_weights(t, n, k, rng)
    sess = session(library, matmul_model(t, k, n), 2)
    for m in (5, 19):  # the row path and the many-row (gemm) path
        x = rng.standard_normal((m, k)).astype(np.float32)
        (y,) = sess.run(None, {"X": x, "W": w})
        want, scale = ref.matmul(t, w, x)
        np.testing.assert_array_less(np.abs(y - want), 1e-5 * scale + 1e-6, err_msg=f"M={m}")


def test_output_shapes_are_inferred_when_the_session_is_made(library):
    """ORT knows Y's shape before running (API 17: InferOutputShapeFn): X's dims with N last, or
    ids' dims and K; a dimension with neither a value nor a name leaves the output unknown."""
    assert session(library, matmul_model(12, 256, 7, ["batch", "seq", 256]), 1).get_outputs()[0].shape == [
        "batch", "seq", 7]
    assert session(library, matmul_model(8, 64, 5, [2, 64]), 1).get_outputs()[0].shape == [2, 5]
    node = helper.make_node(native.GATHER_OP, ["W", "ids"], ["Y"], domain=native.DOMAIN, ggml_type=12, K=256, V=7)
    graph = model(node, [helper.make_tensor_value_info("W", TensorProto.UINT8, [7, 144]),
                         helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", 3])])
    assert session(library, graph, 1).get_outputs()[0].shape == ["b", 3, 256]
    assert session(library, matmul_model(12, 256, 7, [None, 3, 256]), 1).get_outputs()[0].shape == []


def _c_api(path: Path):
    """A second onnxruntime in this process: the C library beside the Python package (the one
    onnxruntime-genai loads), driven through its C API table by ctypes."""
    ort_c = ctypes.CDLL(str(path))
    ort_c.OrtGetApiBase.restype = ctypes.POINTER(ctypes.c_void_p)
    get_api = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)(ort_c.OrtGetApiBase()[0])
    table = ctypes.cast(get_api(17), ctypes.POINTER(ctypes.c_void_p))
    vp = ctypes.c_void_p
    message = ctypes.CFUNCTYPE(ctypes.c_char_p, vp)(table[2])

    def call(index: int, *args):
        status = ctypes.CFUNCTYPE(vp, *[type(a) if isinstance(a, ctypes._SimpleCData) else vp for a in args])(
            table[index])(*args)
        if status:
            raise RuntimeError(message(status).decode())

    def release(index: int, obj) -> None:
        ctypes.CFUNCTYPE(None, vp)(table[index])(obj)

    return ort_c, call, release


def test_a_second_onnxruntime_in_the_process_runs_the_same_library(library):
    """onnxruntime-genai's runtime registers the library beside the Python package's (a model's
    logit check and its serving share a process): each runtime's kernels call back into their own."""
    capi = Path(ort.__file__).parent / "capi"
    found = sorted(capi.glob("libonnxruntime.so*"))
    if not found:
        pytest.skip("no libonnxruntime.so beside the onnxruntime package")
    keep, call, release = _c_api(found[0])
    t, k, n, m = 12, 512, 37, 3
    rng = np.random.default_rng(11)
    w, x = random_weights(t, n, k, rng), rng.standard_normal((m, k)).astype(np.float32)
    env, so, sess, mem, vx, vw = (ctypes.c_void_p() for _ in range(6))
    out = (ctypes.c_void_p * 1)()
    graph = matmul_model(t, k, n)
    call(3, ctypes.c_int(3), ctypes.c_char_p(b"t"), ctypes.byref(env))                # CreateEnv
    call(10, ctypes.byref(so))                                                          # CreateSessionOptions
    call(24, so, ctypes.c_int(2))                                                       # SetIntraOpNumThreads
    call(228, so, ctypes.c_char_p(str(library).encode()))                              # RegisterCustomOpsLibrary_V2
    call(8, env, ctypes.c_char_p(graph), ctypes.c_size_t(len(graph)), so, ctypes.byref(sess))  # FromArray
    call(69, ctypes.c_int(0), ctypes.c_int(0), ctypes.byref(mem))                       # CreateCpuMemoryInfo
    xs, ws = (ctypes.c_int64 * 2)(m, k), (ctypes.c_int64 * 2)(*w.shape)
    call(49, mem, ctypes.c_void_p(x.ctypes.data), ctypes.c_size_t(x.nbytes), xs, ctypes.c_size_t(2),
         ctypes.c_int(1), ctypes.byref(vx))                                             # CreateTensorWithData...
    call(49, mem, ctypes.c_void_p(w.ctypes.data), ctypes.c_size_t(w.nbytes), ws, ctypes.c_size_t(2),
         ctypes.c_int(2), ctypes.byref(vw))
    names, values, outs = (ctypes.c_char_p * 2)(b"X", b"W"), (ctypes.c_void_p * 2)(vx, vw), (ctypes.c_char_p * 1)(b"Y")
    call(9, sess, None, names, values, ctypes.c_size_t(2), outs, ctypes.c_size_t(1), out)  # Run
    data = ctypes.c_void_p()
    call(51, ctypes.c_void_p(out[0]), ctypes.byref(data))                               # GetTensorMutableData
    y = np.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_float)), (m, n)).copy()
    for index, obj in ((96, out[0]), (96, vx), (96, vw), (94, mem), (95, sess), (100, so), (92, env)):
        release(index, ctypes.c_void_p(obj) if isinstance(obj, int) else obj)
    want, scale = ref.matmul(t, w, x)
    np.testing.assert_array_less(np.abs(y - want), 1e-5 * scale + 1e-6)
    (again,) = session(library, graph, 2).run(None, {"X": x, "W": w})  # the Python package's runtime
    np.testing.assert_array_less(np.abs(again - want), 1e-5 * scale + 1e-6)
    del keep
