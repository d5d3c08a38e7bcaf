"""The Whisper encoder's int8 rewrite (models/whisper/graph.py, 7-bit weights) on a small graph of the builder's
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

from ortserve.models.whisper.graph import WEIGHT_MAX, dequantize_nbits8, int8_encoder, per_column_int8

D, HEADS, SEQ, BLOCK = 64, 4, 50, 32


def _encoder(path: Path, rng: np.random.Generator) -> None:
    qkv_w = (rng.standard_normal((D, 3 * D)) * 0.2).astype(np.float32)
    qkv_b = (rng.standard_normal(3 * D) * 0.1).astype(np.float32)
    q8 = rng.integers(100, 157, size=(D, D // BLOCK, BLOCK), dtype=np.uint8)     # N, blocks, block
    scales = (rng.random((D, D // BLOCK)) * 0.01 + 0.005).astype(np.float32)
    m_q8 = rng.integers(1, 256, size=(D, D // BLOCK, BLOCK), dtype=np.uint8)      # the MLP's: signed scales,
    m_scales = (rng.random((D, D // BLOCK)) * 0.004 * rng.choice([-1, 1], (D, D // BLOCK))).astype(np.float32)
    m_scales[::7] = 3e-6                                                          # some subnormal in fp16
    nodes = [helper.make_node("Attention", ["x", "qkv_w", "qkv_b", "", "", "", ""], ["att"], name="/model/layers.0/attn/Attention",
                              domain="com.microsoft", num_heads=HEADS, qkv_hidden_sizes=[D, D, D], scale=0.25),
             helper.make_node("MatMulNBits", ["att", "o_q8", "o_scales"], ["o"], name="/model/layers.0/attn/o_proj/MatMul_Q8",
                              domain="com.microsoft", K=D, N=D, bits=8, block_size=BLOCK, accuracy_level=4),
             helper.make_node("MatMulNBits", ["o", "m_q8", "m_scales"], ["y"], name="/model/layers.0/mlp/fc1/MatMul_Q8",
                              domain="com.microsoft", K=D, N=D, bits=8, block_size=BLOCK, accuracy_level=4)]
    graph = helper.make_graph(nodes, "enc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, D])],
                              [numpy_helper.from_array(qkv_w, "qkv_w"), numpy_helper.from_array(qkv_b, "qkv_b"),
                               numpy_helper.from_array(q8, "o_q8"), numpy_helper.from_array(scales, "o_scales"),
                               numpy_helper.from_array(m_q8, "m_q8"), numpy_helper.from_array(m_scales, "m_scales")])
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


def test_q8_0_rows_hold_the_same_weights() -> None:
    """MatMulNBits' 8-bit blocks (uint8 around 128, fp32 scales, negative and subnormal ones too)
    as Q8_0 rows: the int8 values unchanged, the scale fp16's nearest; a scale fp16 cannot hold: None."""
    from ortserve.models.whisper.graph import q8_0_rows
    from ortserve.native import reference as ref

    rng = np.random.default_rng(3)
    q = rng.integers(1, 256, size=(5, 4, BLOCK), dtype=np.uint8)
    scales = np.array([0.004, -0.003, 3e-6, -5e-7] * 5, np.float32).reshape(5, 4)
    rows = q8_0_rows(q, scales)
    assert rows is not None and rows.shape == (5, 4 * 34) and rows.dtype == np.uint8
    blocks = rows.reshape(5, 4, 34)
    d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    assert np.array_equal(blocks[..., 2:].view(np.int8), (q.astype(np.int16) - 128).astype(np.int8))
    assert np.array_equal(d, scales.astype(np.float16).astype(np.float32))
    assert np.all(np.abs(d - scales) <= np.maximum(np.abs(scales) * 2.0 ** -11, 2.0 ** -25))
    want = (d[..., None] * (q.astype(np.float32) - 128)).reshape(5, -1)
    assert np.array_equal(np.asarray(ref.dequantize(8, rows, 4 * BLOCK), np.float32).reshape(5, -1), want)
    assert q8_0_rows(q, np.full((5, 4), 1e6, np.float32)) is None        # past fp16's range


def test_native_q8_moves_the_named_matrices(tmp_path: Path) -> None:
    """``native_q8`` turns the named 8-bit MatMulNBits into GgufMatMul over Q8_0 rows (the attention's
    stays), and ONNX Runtime with the native library gives the as-built outputs within the
    per-block activation rounding both make."""
    import sys

    import pytest

    from ortserve import native
    from ortserve.models.whisper.graph import native_q8
    from ortserve.native import build as native_build

    if not sys.platform.startswith("linux"):
        pytest.skip("the native library builds on Linux")
    result = native_build.build()
    assert result.ok, result.reason
    native._status.cache_clear()
    rng = np.random.default_rng(4)
    path = tmp_path / "encoder.onnx"
    _encoder(path, rng)
    x = rng.standard_normal((1, SEQ, D)).astype(np.float32)
    before = _run(path, x)
    assert native_q8(path, ("/mlp/",)) == 1
    model = onnx.load(str(path))
    assert [(n.op_type, n.domain) for n in model.graph.node if "MatMul" in n.op_type] == [
        ("MatMulNBits", "com.microsoft"), ("GgufMatMul", "ortserve.gguf")]
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(str(result.library))
    after = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    assert after.shape == before.shape
    assert np.abs(after - before).max() <= 0.02 * np.abs(before).max()
    assert native_q8(path, ("/mlp/",)) == 0                          # nothing left to move
