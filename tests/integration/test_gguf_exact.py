"""Lossless GGUF import on synthetic tiny Llamas, one per block type (and mixes of them).

Each file is written with the ``gguf`` package (SmolLM2's tokenizer, random weights). The
imported model must run to the dequantized fp32 reference's logits within float rounding
when MatMulNBits computes in fp32, and every weight must equal the reference weight.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from tests.llamacpp import source_reader

from ortserve.models.gguf.exact import LOGIT_TOL, import_gguf_exact, logit_check
from ortserve.models.gguf.reader import UnsupportedBlockType

Q = gguf.GGMLQuantizationType
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def quantized_bytes(rng: np.random.Generator, qtype: str, rows: int, cols: int) -> np.ndarray:
    """Blocks of ``qtype`` for a [rows, cols] matrix: quantized floats, or random K-quant blocks."""
    t = Q[qtype]
    if qtype.endswith("_K") or qtype.startswith("IQ"):   # no quantizer in gguf: random blocks, sane scales
        per, size = gguf.constants.GGML_QUANT_SIZES[t]
        b = rng.integers(0, 256, (rows * cols // per, size), dtype=np.uint8)
        d = rng.uniform(2e-4, 1e-3, (b.shape[0], 2)).astype(np.float16).view(np.uint8)
        at = {"Q6_K": slice(208, 210), "Q2_K": slice(80, 84), "Q3_K": slice(108, 110),
              "IQ4_NL": slice(0, 2), "IQ4_XS": slice(0, 2), "IQ3_XXS": slice(0, 2)}.get(qtype, slice(0, 4))
        b[:, at] = d[:, : at.stop - at.start]
        return b.reshape(rows, -1)
    w = rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
    return gguf.quants.quantize(w, t)


def write_tiny_gguf(path: Path, types: list[dict[str, str]], *, embd: str = "Q8_0",
                    output: str | None = None, seed: int = 0) -> Path:
    """A 2-layer Llama GGUF; ``types[layer]`` maps matrix kind (attn_q, ffn_up, ...) -> GGML type."""
    from ortserve.models.catalog import embedded_gguf

    rng = np.random.default_rng(seed)
    src = source_reader(embedded_gguf())
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    for key, f in src.fields.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)

    def add(name: str, qtype: str, rows: int, cols: int) -> None:
        if qtype in ("F32", "F16"):
            w.add_tensor(name, rng.normal(0, 0.05, (rows, cols)).astype(np.float32 if qtype == "F32" else np.float16))
        else:
            w.add_tensor(name, quantized_bytes(rng, qtype, rows, cols), raw_dtype=Q[qtype])

    add("token_embd.weight", embd, vocab, HIDDEN)
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
              "attn_v": (HIDDEN // HEADS * KV_HEADS, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", rng.uniform(0.8, 1.2, HIDDEN).astype(np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", rng.uniform(0.8, 1.2, HIDDEN).astype(np.float32))
        for kind in MATRICES:
            add(f"blk.{i}.{kind}.weight", types[i % len(types)][kind], *shapes[kind])
    w.add_tensor("output_norm.weight", rng.uniform(0.8, 1.2, HIDDEN).astype(np.float32))
    if output:
        add("output.weight", output, vocab, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def uniform(qtype: str) -> list[dict[str, str]]:
    return [dict.fromkeys(MATRICES, qtype)]


# K_M-like files: bit widths, block sizes (16/32) and minimum/no-minimum types mixed inside
# the fused q/k/v node; between them every supported block type appears.
MIXED_A = [{"attn_q": "Q4_K", "attn_k": "Q4_1", "attn_v": "Q6_K", "attn_output": "Q5_0",
            "ffn_gate": "Q5_K", "ffn_up": "Q4_0", "ffn_down": "Q8_0"},
           {"attn_q": "Q5_1", "attn_k": "Q5_K", "attn_v": "Q4_0", "attn_output": "Q4_K",
            "ffn_gate": "Q6_K", "ffn_up": "Q4_1", "ffn_down": "Q5_1"}]
MIXED_B = [{"attn_q": "Q4_0", "attn_k": "Q3_K", "attn_v": "Q8_0", "attn_output": "Q6_K",
            "ffn_gate": "Q2_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K"}]


def assert_exact(tmp_path: Path, gguf_file: Path) -> dict:
    out = tmp_path / "exact"
    report = import_gguf_exact(gguf_file, out, tmp_path / "work")
    assert report["max_weight_error"] < 1e-6
    # Independently of the import's own check: logits at fp32 compute equal the reference.
    again = logit_check(out, Path(report["reference_dir"]), n_tokens=24, seed=7)
    assert again["fp32_compute"] < LOGIT_TOL, again
    assert report["logit_error"]["fp32_compute"] < LOGIT_TOL
    return report


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_block_type_imports_exactly(tmp_path: Path, qtype: str) -> None:
    import onnx

    report = assert_exact(tmp_path, write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", uniform(qtype)))
    tied_head = qtype == "Q8_0"    # the LM head is the Q8_0 token embedding
    assert report["gguf_types"][qtype] == LAYERS * len(MATRICES) + tied_head
    assert report["folded_minimums"] == (LAYERS * 4 if qtype == "Q4_1" else 0)   # qkv, o, gate_up, down
    ops = [n.op_type for n in onnx.load(str(tmp_path / "exact" / "model.onnx"), load_external_data=False).graph.node]
    assert ops.count("MatMulNBits") == LAYERS * 4 + 1 and ops.count("Split") == LAYERS  # gate+up fused


def test_mixed_types_with_tied_embedding_with_minimums(tmp_path: Path) -> None:
    """All eight block types; the Q4_1 tied embedding has no integer GatherBlockQuantized
    form, so the lookup table stays float while the LM head keeps the blocks."""
    import onnx

    report = assert_exact(tmp_path, write_tiny_gguf(tmp_path / "a.gguf", MIXED_A, embd="Q4_1"))
    assert set(report["gguf_types"]) == {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}
    graph = onnx.load(str(tmp_path / "exact" / "model.onnx"), load_external_data=False).graph
    assert "GatherBlockQuantized" not in {n.op_type for n in graph.node}


def test_k_quants_with_untied_head(tmp_path: Path) -> None:
    report = assert_exact(tmp_path, write_tiny_gguf(tmp_path / "b.gguf", MIXED_B, embd="F32", output="Q6_K"))
    assert report["gguf_types"]["Q6_K"] == 2 * LAYERS + 1
    assert report["gguf_types"]["Q2_K"] == report["gguf_types"]["Q3_K"] == LAYERS


def test_float_matrices_and_tied_float_head_become_plain_matmuls(tmp_path: Path) -> None:
    """Files that keep some matrices in F16/F32 stay exact: those nodes are fp32 MatMuls."""
    import onnx

    types = [{"attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "F16", "attn_output": "F32",
              "ffn_gate": "Q8_0", "ffn_up": "F16", "ffn_down": "Q4_0"}]
    report = assert_exact(tmp_path, write_tiny_gguf(tmp_path / "f.gguf", types, embd="F16"))
    assert report["gguf_types"]["F16"] == 2 * LAYERS + 1
    ops = [n.op_type for n in onnx.load(str(tmp_path / "exact" / "model.onnx"), load_external_data=False).graph.node]
    assert "GatherBlockQuantized" not in ops and "Transpose" in ops
    assert ops.count("MatMulNBits") == 2 * LAYERS       # o_proj is F32, qkv/up hold F16 parts


def test_iq4_types_import_exactly_through_the_builder_path(tmp_path: Path) -> None:
    """A small IQ4_XS file (IQ4_NL matrices, tied IQ4_XS embedding) on the builder-patching
    path: 4-bit level indices held as 8-bit codes, the same weights as gguf's dequantization."""
    types = [{**uniform("IQ4_XS")[0], "attn_v": "IQ4_NL", "ffn_down": "IQ4_NL"}]
    report = assert_exact(tmp_path, write_tiny_gguf(tmp_path / "iq4.gguf", types, embd="IQ4_XS"))
    assert report["gguf_types"] == {"IQ4_XS": LAYERS * 5 + 1, "IQ4_NL": LAYERS * 2}


def test_unsupported_block_type_is_refused_before_any_work(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "iq3.gguf", [{**uniform("Q4_0")[0], "ffn_down": "IQ3_XXS"}])
    with pytest.raises(UnsupportedBlockType, match="IQ3_XXS"):
        import_gguf_exact(path, tmp_path / "out", tmp_path / "work")
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
