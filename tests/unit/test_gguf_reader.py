"""GGUF block decoding into MatMulNBits form: equal to gguf's own dequantization, bounds
checked, and laid out the way onnxruntime's MatMulNBits reads it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ortserve.errors import ModelError
from ortserve.models.gguf.exact import GGUFWeights, pack_codes
from ortserve.models.gguf.reader import SUPPORTED, UnsupportedBlockType, concat_rows, decode

Q = gguf.GGMLQuantizationType
ROWS, COLS = 6, 512


def blocks(qtype: str, rows: int = ROWS, cols: int = COLS, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype.endswith("_K") or qtype.startswith("IQ"):   # no quantizer in gguf: random blocks, sane fp16 scales
        per, size = gguf.constants.GGML_QUANT_SIZES[Q[qtype]]
        b = rng.integers(0, 256, (rows * cols // per, size), dtype=np.uint8)
        d = rng.uniform(-1e-2, 1e-2, (b.shape[0], 2)).astype(np.float16).view(np.uint8)
        at = {"Q6_K": slice(208, 210), "Q2_K": slice(80, 84), "Q3_K": slice(108, 110),
              "IQ4_NL": slice(0, 2), "IQ4_XS": slice(0, 2), "IQ3_XXS": slice(0, 2)}.get(qtype, slice(0, 4))
        b[:, at] = d[:, : at.stop - at.start]
        return b.reshape(rows, -1)
    return gguf.quants.quantize(rng.normal(0, 1, (rows, cols)).astype(np.float32), Q[qtype])


@pytest.mark.parametrize("qtype", SUPPORTED)
def test_decode_equals_gguf_dequantize(qtype: str) -> None:
    raw = blocks(qtype)
    form = decode(qtype, raw, ROWS, COLS)
    want = gguf.quants.dequantize(raw, Q[qtype]).astype(np.float64)
    assert form.codes.dtype == np.uint8 and form.codes.max() < (1 << form.bits)
    assert np.abs(form.dequantize() - want).max() <= 1e-6 * np.abs(want).max()
    assert form.bits == (4 if qtype in ("Q4_0", "Q4_1", "Q2_K", "Q3_K", "Q4_K") else 8)
    assert (form.offsets is not None) == (qtype in ("Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K"))


def test_concat_rows_widens_without_changing_values() -> None:
    parts = [decode(t, blocks(t, seed=i), ROWS, COLS) for i, t in enumerate(("Q4_0", "Q6_K", "Q4_1"))]
    merged = concat_rows(parts)
    assert (merged.bits, merged.group) == (8, 16) and merged.offsets is not None
    want = np.concatenate([p.dequantize() for p in parts])
    assert np.abs(merged.dequantize() - want).max() <= 1e-6 * np.abs(want).max()


def test_bounds_and_unsupported_types_are_refused() -> None:
    raw = blocks("Q4_0")
    with pytest.raises(ModelError, match="needs"):
        decode("Q4_0", raw[:, :-1], ROWS, COLS)          # truncated tensor
    with pytest.raises(ModelError, match="whole number"):
        decode("Q4_K", blocks("Q4_0"), ROWS * 4, COLS // 4)   # 256 does not divide a 128 row
    with pytest.raises(UnsupportedBlockType, match="IQ3_XXS"):
        decode("IQ3_XXS", blocks("IQ3_XXS"), ROWS, COLS)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q6_K", "Q3_K"])
def test_packed_codes_run_in_matmulnbits(qtype: str) -> None:
    """The packed layout (B [N, blocks, blob], low nibble first) as onnxruntime reads it."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    form = decode(qtype, blocks(qtype), ROWS, COLS)
    node = helper.make_node("MatMulNBits", ["x", "B", "S"], ["y"], domain="com.microsoft", K=COLS, N=ROWS,
                            bits=form.bits, block_size=form.group, accuracy_level=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, COLS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, ROWS])],
                              [numpy_helper.from_array(pack_codes(form), "B"),
                               numpy_helper.from_array(form.scales, "S")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    x = np.random.default_rng(1).normal(0, 1, (1, COLS)).astype(np.float32)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = x.astype(np.float64) @ form.dequantize().T
    assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max()


def test_qk_row_permutation_matches_transformers() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    w = GGUFWeights(Path("x.gguf"), "llama", n_head=9, n_head_kv=3)
    undo = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    for name, rows, kv in (("blk.0.attn_q.weight", 576, 9), ("blk.3.attn_k.weight", 192, 3)):
        want = undo._reverse_permute_weights(np.arange(rows)[:, None], 9, kv)[:, 0]
        assert np.array_equal(w.row_permutation(name, rows), want)
    assert w.row_permutation("blk.0.attn_v.weight", 192) is None
    assert GGUFWeights(Path("x.gguf"), "qwen2", 9, 3).row_permutation("blk.0.attn_q.weight", 576) is None
