"""The Whisper encoder's int8 rewrite (models/whisper_graph.py, 7-bit weights) on a small graph of the builder's
shape and names: a fused ``Attention`` (fp32 QKV weight and bias), the attention's output
projection and an MLP projection as 8-bit ``MatMulNBits``. After the rewrite the attention's
projections are int8 GEMMs, the MLP's is as built, ONNX Runtime runs it, and the outputs stay within
7-bit weights' error of the original's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ortserve.models.whisper_graph import WEIGHT_MAX, dequantize_nbits8, int8_encoder, per_column_int8

D, HEADS, SEQ, BLOCK = 64, 4, 50, 32


def _encoder(path: Path, rng: np.random.Generator) -> None:
    qkv_w = (rng.standard_normal((D, 3 * D)) * 0.2).astype(np.float32)
    qkv_b = (rng.standard_normal(3 * D) * 0.1).astype(np.float32)
    q8 = rng.integers(100, 157, size=(D, D // BLOCK, BLOCK), dtype=np.uint8)     # N, blocks, block
    scales = (rng.random((D, D // BLOCK)) * 0.01 + 0.005).astype(np.float32)
    nodes = [helper.make_node("Attention", ["x", "qkv_w", "qkv_b", "", "", "", ""], ["att"], name="/model/layers.0/attn/Attention",
                              domain="com.microsoft", num_heads=HEADS, qkv_hidden_sizes=[D, D, D], scale=0.25),
             helper.make_node("MatMulNBits", ["att", "o_q8", "o_scales"], ["o"], name="/model/layers.0/attn/o_proj/MatMul_Q8",
                              domain="com.microsoft", K=D, N=D, bits=8, block_size=BLOCK, accuracy_level=4),
             helper.make_node("MatMulNBits", ["o", "o_q8", "o_scales"], ["y"], name="/model/layers.0/mlp/fc1/MatMul_Q8",
                              domain="com.microsoft", K=D, N=D, bits=8, block_size=BLOCK, accuracy_level=4)]
    graph = helper.make_graph(nodes, "enc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, D])],
                              [numpy_helper.from_array(qkv_w, "qkv_w"), numpy_helper.from_array(qkv_b, "qkv_b"),
                               numpy_helper.from_array(q8, "o_q8"), numpy_helper.from_array(scales, "o_scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=0)


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]


def test_int8_encoder_replaces_fp32_projections(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "encoder.onnx"
    _encoder(path, rng)
    x = rng.standard_normal((1, SEQ, D)).astype(np.float32)
    before = _run(path, x)
    assert int8_encoder(path) == 2
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops == ["DynamicQuantizeMatMul", "Split", "MultiHeadAttention", "DynamicQuantizeMatMul", "MatMulNBits"]
    after = _run(path, x)
    assert after.shape == before.shape
    assert np.abs(after - before).max() <= 0.06 * np.abs(before).max()   # 7-bit weights: 0.041 (8-bit: 0.026)
    assert int8_encoder(path) == 0                      # nothing left to rewrite


def test_int8_weights_cannot_saturate_vpmaddubsw(tmp_path: Path) -> None:
    """On AVX2 without VNNI, MLAS's u8 x s8 kernel sums byte products in pairs into int16
    (vpmaddubsw, saturating). Every weight the rewrite writes must keep 255 * |q| * 2 within int16,
    so the encoder is right on every CPU whatever the one that imported it (the arithmetic bound,
    not this machine's kernel)."""
    rng = np.random.default_rng(2)
    path = tmp_path / "encoder.onnx"
    _encoder(path, rng)
    assert int8_encoder(path) == 2
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    weights = [numpy_helper.to_array(inits[n.input[1]]) for n in model.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    assert len(weights) == 2
    for q in weights:
        assert q.dtype == np.int8
        worst = int(np.abs(q.astype(np.int64)).max())
        assert worst == WEIGHT_MAX                      # the range is used, not wasted
        assert 255 * worst * 2 <= np.iinfo(np.int16).max


def test_quantization_round_trips() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    q, scale = per_column_int8(w)
    assert q.dtype == np.int8 and scale.shape == (48,)
    assert np.abs(q * scale - w).max() <= scale.max() / 2 + 1e-6
    assert np.abs(q.astype(np.int64)).max() == WEIGHT_MAX <= 64
    blocks = rng.integers(0, 256, size=(48, 2, 32), dtype=np.uint8)
    scales = rng.random((48, 2)).astype(np.float32)
    back = dequantize_nbits8(blocks, scales, 64, 48, 32)
    assert back.shape == (64, 48)
    assert np.allclose(back[:32, 5], (blocks[5, 0].astype(np.float32) - 128) * scales[5, 0])
