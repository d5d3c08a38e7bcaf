"""The library's SkipRmsNorm op against onnxruntime's own SkipSimplifiedLayerNormalization on the
same inputs: the normed rows and the residual sum, one row (a decode step, in the calling thread)
and many (on the pool), the scalar and AVX2 paths, a width that is not a multiple of 8."""
from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortserve import native
from ortserve.native import build as native_build

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the library builds on Linux")


@pytest.fixture(scope="module")
def library():
    result = native_build.build()
    assert result.ok, result.reason
    assert "skip_rms_norm" in native.library_features(result.library)
    return result.library


@pytest.fixture(params=["scalar", "best"])
def isa(request, library):
    lib = native._load(library)
    before = lib.osg_isa().decode()
    if request.param == "scalar":
        assert lib.osg_set_isa(b"scalar") == 0
    yield request.param
    lib.osg_set_isa(b"avx512" if before == "avx512vnni" else before.encode())


def session(library, ours: bool, h: int, threads: int = 2) -> ort.InferenceSession:
    f = TensorProto.FLOAT
    if ours:
        node = helper.make_node("SkipRmsNorm", ["x", "skip", "gamma"], ["out", "sum"], domain=native.DOMAIN,
                                epsilon=1e-5)
    else:
        node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["out", "", "", "sum"],
                                domain="com.microsoft", epsilon=1e-5)
    graph = helper.make_graph([node], "norm", [helper.make_tensor_value_info("x", f, ["b", "s", h]),
                                               helper.make_tensor_value_info("skip", f, ["b", "s", h]),
                                               helper.make_tensor_value_info("gamma", f, [h])],
                              [helper.make_tensor_value_info(n, f, None) for n in ("out", "sum")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
                                                    helper.make_opsetid(native.DOMAIN, native.OPSET)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("h", [2048, 100])
@pytest.mark.parametrize("rows", [1, 9])
def test_skip_rms_norm_equals_onnxruntimes(library, isa, h, rows):
    rng = np.random.default_rng(h + rows)
    feeds = {"x": rng.standard_normal((1, rows, h)).astype(np.float32) * 3,
             "skip": rng.standard_normal((1, rows, h)).astype(np.float32),
             "gamma": rng.uniform(0.5, 1.5, h).astype(np.float32)}
    want_out, want_sum = session(library, False, h).run(None, feeds)
    got_out, got_sum = session(library, True, h).run(None, feeds)
    np.testing.assert_array_equal(got_sum, want_sum)
    np.testing.assert_allclose(got_out, want_out, rtol=3e-6, atol=1e-6)


def test_shapes_that_disagree_are_errors(library):
    sess = session(library, True, 8)
    with pytest.raises(Exception, match=r"SkipRmsNorm: input and skip must be float tensors of one shape"):
        sess.run(None, {"x": np.zeros((1, 1, 8), np.float32), "skip": np.zeros((1, 2, 8), np.float32),
                        "gamma": np.ones(8, np.float32)})
