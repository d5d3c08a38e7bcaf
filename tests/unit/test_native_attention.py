"""The library's CachedAttention op against onnxruntime's own GroupQueryAttention (do_rotary=1, not
interleaved, no window, no soft-cap), on the same inputs, with past and present bound to one buffer
as the engine binds them: a first prompt, a chunk after a prefix, decode rows of different lengths,
a speculation verify step, packed and separate q/k/v, 1 and 2 threads.
The outputs of the valid tokens and the whole cache after the call must agree within float rounding."""
from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortserve import native
from ortserve.native import build as native_build

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the library builds on Linux")

H, HKV, D, CAP, POSITIONS = 8, 2, 32, 32, 48


@pytest.fixture(scope="module")
def library():
    result = native_build.build()
    assert result.ok, result.reason
    assert "cached_attention" in native.library_features(result.library)
    return result.library


def graph(op: str, packed: bool, rot: int, scale: float) -> bytes:
    f = TensorProto.FLOAT
    q_width = (H + 2 * HKV) * D if packed else H * D
    inputs = [helper.make_tensor_value_info("query", f, ["b", "s", q_width])]
    if not packed:
        inputs += [helper.make_tensor_value_info(n, f, ["b", "s", HKV * D]) for n in ("key", "value")]
    inputs += [helper.make_tensor_value_info(n, f, ["b", HKV, "cap", D]) for n in ("past_key", "past_value")]
    inputs += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
               helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
               helper.make_tensor_value_info("cos_cache", f, [POSITIONS, rot // 2]),
               helper.make_tensor_value_info("sin_cache", f, [POSITIONS, rot // 2])]
    names = ["query", "" if packed else "key", "" if packed else "value", "past_key", "past_value", "seqlens_k",
             "total_sequence_length", "cos_cache", "sin_cache"]
    if op == "GroupQueryAttention":
        node = helper.make_node(op, names, ["out", "present_key", "present_value"], domain="com.microsoft",
                                num_heads=H, kv_num_heads=HKV, do_rotary=1, rotary_interleaved=0, scale=scale,
                                local_window_size=-1, softcap=0.0)
    else:
        node = helper.make_node(op, names, ["out", "present_key", "present_value"], domain=native.DOMAIN,
                                num_heads=H, kv_num_heads=HKV, scale=scale)
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "present_key", "present_value")]
    return helper.make_model(helper.make_graph([node], "attention", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
                                            helper.make_opsetid(native.DOMAIN, native.OPSET)]).SerializeToString()


def run(library, op: str, feeds: dict, past: tuple[np.ndarray, np.ndarray], packed: bool, rot: int, scale: float,
        threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.register_custom_ops_library(str(library))
    sess = ort.InferenceSession(graph(op, packed, rot, scale), so, providers=["CPUExecutionProvider"])
    keys, values = (p.copy() for p in past)
    io = sess.io_binding()
    for name, array in feeds.items():
        io.bind_cpu_input(name, array)
    for name, cache in (("key", keys), ("value", values)):   # one buffer for past and present, as the Runner binds
        io.bind_input(f"past_{name}", "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)
        io.bind_output(f"present_{name}", "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)
    io.bind_output("out", "cpu")
    sess.run_with_iobinding(io)
    return io.get_outputs()[0].numpy(), keys, values


def rotary(rot: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / 10000 ** (np.arange(0, rot, 2) / rot)
    angles = np.arange(POSITIONS)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


# (lengths held before the call, new tokens a row): what the Runner's prefill, decode and verify feed
CASES = {
    "first prompt": ([0], 5),
    "chunk after a prefix": ([7], 3),
    "decode rows of different lengths": ([4, 9, 0], 1),
    "speculation's verify step": ([5], 4),
}   # onnxruntime's GQA takes several new tokens after a past in one row only


@pytest.fixture(params=["scalar", "best"])
def isa(request, library):
    """The plain C loops (the kernels' level forced to scalar) and the CPU's best (AVX2 here)."""
    lib = native._load(library)
    before = lib.osg_isa().decode()
    if request.param == "scalar":
        assert lib.osg_set_isa(b"scalar") == 0
    yield request.param
    lib.osg_set_isa(b"avx512" if before == "avx512vnni" else before.encode())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("packed", [False, True], ids=["q,k,v", "packed qkv"])
@pytest.mark.parametrize("case", list(CASES))
def test_cached_attention_equals_group_query_attention(library, isa, case, packed, threads):
    lengths, s = CASES[case]
    b = len(lengths)
    rng = np.random.default_rng(len(case) * 7 + threads + packed)
    rot = 32 if packed else 16   # most of the head rotated, or less than half of it (partial rotary)
    cos, sin = rotary(rot)
    past = tuple((rng.standard_normal((b, HKV, CAP, D)) * 0.5).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((b, s, H * D)).astype(np.float32)
    k, v = (rng.standard_normal((b, s, HKV * D)).astype(np.float32) for _ in range(2))
    feeds = {"query": np.concatenate([q, k, v], axis=-1)} if packed else {"query": q, "key": k, "value": v}
    feeds |= {"seqlens_k": (np.array(lengths) + s - 1).astype(np.int32),
              "total_sequence_length": np.array(max(lengths) + s, np.int32), "cos_cache": cos, "sin_cache": sin}
    scale = 0.0 if packed else 0.3   # 0: 1/sqrt(D)
    want = run(library, "GroupQueryAttention", feeds, past, packed, rot, scale, threads)
    got = run(library, "CachedAttention", feeds, past, packed, rot, scale, threads)
    for row, held in enumerate(lengths):
        np.testing.assert_allclose(got[0][row], want[0][row], rtol=2e-5, atol=2e-6, err_msg=f"{case}: row {row}")
        # the keys and values of every position the row holds after the call; the rest untouched
        for cache_got, cache_want, before in zip(got[1:], want[1:], past):
            np.testing.assert_allclose(cache_got[row, :, :held + s], cache_want[row, :, :held + s], rtol=2e-6, atol=2e-6)
            np.testing.assert_array_equal(cache_got[row, :, held + s:], before[row, :, held + s:])


def test_a_row_past_the_cache_is_an_error(library):
    cos, sin = rotary(D)
    feeds = {"query": np.zeros((1, 1, H * D), np.float32), "key": np.zeros((1, 1, HKV * D), np.float32),
             "value": np.zeros((1, 1, HKV * D), np.float32), "seqlens_k": np.array([CAP], np.int32),
             "total_sequence_length": np.array(CAP + 1, np.int32), "cos_cache": cos, "sin_cache": sin}
    past = tuple(np.zeros((1, HKV, CAP, D), np.float32) for _ in range(2))
    with pytest.raises(Exception, match=r"CachedAttention: row 0 reaches position 32, past the cache's capacity 32"):
        run(library, "CachedAttention", feeds, past, False, D, 0.0, 1)
