"""engine/graph.py's edits for the native kernels. fuse_swiglu: the MLP's Split -> silu -> Mul ->
GgufMatMul (down) becomes one GgufMatMul with swiglu=1, only where the library has it and nothing
else reads the tensors between, and the folded graph computes what the four nodes did (up to the
rounding of the activation's int8 quantization, which the SwiGLU's last ulp can move by one step).
skip_rms_norm: a SkipSimplifiedLayerNormalization becomes the library's SkipRmsNorm only where it
computes the same (tests/unit/test_native_norm.py compares the two ops)."""
from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortserve import native
from ortserve.engine.graph import fuse_swiglu, native_edits, skip_rms_norm
from ortserve.native import build as native_build

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the library builds on Linux")

K, F, N = 64, 96, 40   # hidden, ffn, outputs
Q8_0 = 8


@pytest.fixture(scope="module")
def library():
    result = native_build.build()
    assert result.ok, result.reason
    return result.library


def q8_0_rows(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Random Q8_0 rows: an fp16 scale and 32 int8 values a block."""
    blocks = np.zeros((n, k // 32, 34), np.uint8)
    blocks[..., :2] = rng.uniform(0.005, 0.02, (n, k // 32)).astype(np.float16)[..., None].view(np.uint8)
    blocks[..., 2:] = rng.integers(-127, 128, (n, k // 32, 32)).astype(np.int8).view(np.uint8)
    return blocks.reshape(n, -1)


def mlp(rng: np.random.Generator, second_reader: bool = False):
    m = "/model/layers.0/mlp"
    gu, split, sig, act, prod = (f"{m}/{x}" for x in ("gate_up", "split", "sig", "act", "prod"))
    nodes = [
        helper.make_node(native.MATMUL_OP, ["X", "gate_up_rows"], [gu], domain=native.DOMAIN, name=gu,
                         ggml_type=Q8_0, K=K, N=2 * F),
        helper.make_node("Split", [gu, "sizes"], [f"{split}/0", f"{split}/1"], name=split, axis=-1),
        helper.make_node("Sigmoid", [f"{split}/0"], [sig], name=sig),
        helper.make_node("Mul", [f"{split}/0", sig], [act], name=act),
        helper.make_node("Mul", [act, f"{split}/1"], [prod], name=prod),
        helper.make_node(native.MATMUL_OP, [prod, "down_rows"], ["Y"], domain=native.DOMAIN, name=f"{m}/down",
                         ggml_type=Q8_0, K=F, N=N),
    ]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if second_reader:   # what a LoRA term on down_proj adds: another reader of the product
        nodes.append(helper.make_node("ReduceSum", [prod], ["Z"], name="lora_like", keepdims=1))
        outputs.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, None))
    inits = [numpy_helper.from_array(q8_0_rows(rng, 2 * F, K), "gate_up_rows"),
             numpy_helper.from_array(q8_0_rows(rng, N, F), "down_rows"),
             numpy_helper.from_array(np.array([F, F], np.int64), "sizes")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", "s", K])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(native.DOMAIN, native.OPSET)])


def run(library, model, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        ["Y"], {"X": x})[0]


def test_the_four_nodes_become_one_that_computes_the_same(library):
    rng = np.random.default_rng(0)
    plain = mlp(rng)
    folded = mlp(np.random.default_rng(0))
    assert fuse_swiglu(folded, native.library_features(library)) == 1
    ops = [n.op_type for n in folded.graph.node]
    assert ops == [native.MATMUL_OP, native.MATMUL_OP]
    down = folded.graph.node[1]
    assert down.input[0] == folded.graph.node[0].output[0]
    assert {a.name: a.i for a in down.attribute}["swiglu"] == 1
    assert "sizes" not in {t.name for t in folded.graph.initializer}   # the Split's sizes went with it
    for m in (1, 7):
        x = rng.standard_normal((1, m, K)).astype(np.float32)
        want, got = run(library, plain, x), run(library, folded, x)
        assert got.shape == want.shape == (1, m, N)
        # one int8 step of the activation moves an output by at most its scale times |w|: far below this
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_a_second_reader_of_the_product_keeps_the_nodes(library):
    model = mlp(np.random.default_rng(1), second_reader=True)
    assert fuse_swiglu(model, native.library_features(library)) == 0
    assert [n.op_type for n in model.graph.node].count("Mul") == 2


def test_a_library_without_the_attribute_keeps_the_nodes(tmp_path):
    model = mlp(np.random.default_rng(2))
    assert fuse_swiglu(model, frozenset()) == 0
    old = tmp_path / native.LIBRARY_NAME   # not a library at all: refused, not loaded
    old.write_bytes(b"\x7fELF not really")
    assert fuse_swiglu(model, native.library_features(old)) == 0 and len(model.graph.node) == 6


def norm_model(bias: bool = False, outputs: tuple[str, ...] = ("out", "", "", "sum"), **attrs) -> object:
    f = TensorProto.FLOAT
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"] + (["bias"] if bias else []),
                            list(outputs), domain="com.microsoft", name="/model/layers.1/input_layernorm/SkipLayerNorm",
                            **{"epsilon": 1e-5, **attrs})
    inputs = [helper.make_tensor_value_info(n, f, None) for n in ("x", "skip", "gamma", "past_key_values.0.key")]
    graph = helper.make_graph([node], "norm", inputs, [helper.make_tensor_value_info("out", f, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def test_skip_norm_becomes_skip_rms_norm_with_its_two_read_outputs(library):
    model = norm_model()
    assert skip_rms_norm(model, native.library_features(library)) == 1
    node = model.graph.node[0]
    assert (node.op_type, node.domain, list(node.output)) == ("SkipRmsNorm", native.DOMAIN, ["out", "sum"])
    alone = norm_model(outputs=("out",))   # nobody reads the sum: the op still makes one, under its own name
    assert skip_rms_norm(alone, native.library_features(library)) == 1 and alone.graph.node[0].output[1].endswith("/ortserve_sum")


@pytest.mark.parametrize("case", ["bias", "mean output", "attribute", "fp16"])
def test_what_skip_rms_norm_does_not_compute_stays(library, case):
    model = {"bias": lambda: norm_model(bias=True), "mean output": lambda: norm_model(outputs=("out", "mean", "", "sum")),
             "attribute": lambda: norm_model(stash_type=1), "fp16": norm_model}[case]()
    if case == "fp16":
        model.graph.input[3].type.tensor_type.elem_type = TensorProto.FLOAT16
    assert skip_rms_norm(model, native.library_features(library)) == 0
    assert model.graph.node[0].op_type == "SkipSimplifiedLayerNormalization"


def test_native_edits_are_nothing_without_a_library():
    model = mlp(np.random.default_rng(3))
    assert native_edits(model, None) == {} and len(model.graph.node) == 6
