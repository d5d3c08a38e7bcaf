"""Phi-3/Phi-4-mini and Gemma 2/3 through the streamed GGUF import (models/gguf/families.py)
against an independent numpy forward pass of gguf's own dequantized weights.

The files are small random GGUFs with each family's real tensor names and metadata keys (as
llama.cpp's converter writes them) and a real tokenizer from llama.cpp's sdist (tests/llamacpp.py):
phi-3's for phi3, llama-spm (SentencePiece, as Gemma's) for gemma. The reference follows llama.cpp's
graphs (src/models/phi3.cpp, gemma2.cpp, gemma3.cpp): NEOX RoPE on the first rope_dim dimensions,
LongRoPE factors and attn_factor, sliding windows masking keys ``window`` or more positions back,
soft-capping, Gemma's sqrt(d) embedding scale, post norms and GELU-tanh. Greedy tokens must be equal
with MatMulNBits computing in fp32, and the logits within float rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from tests.integration.test_gguf_exact import quantized_bytes
from tests.integration.test_gguf_stream import og_greedy, tensor_reads

from ortserve.errors import ModelError
from ortserve.models.gguf.fast import import_gguf_streamed, streamable
from ortserve.models.gguf.reader import preflight
from ortserve.models.gguf_check import logits as onnx_logits

Q = gguf.GGMLQuantizationType
HIDDEN, FFN, LAYERS, CONTEXT = 256, 512, 2, 64
PROMPT, NEW = [1, 504, 3458, 314, 260, 1345, 30], 6
LONG_PROMPT = [int(x) for x in np.random.default_rng(5).integers(3, 30000, 40)]

# name: (arch, vocab, shape and metadata options, matrix types)
CASES: dict[str, dict[str, Any]] = {
    # Phi-3.5-mini: fused q/k/v and gate/up, heads == kv heads, LongRoPE (original context 32 of 64),
    # an untied Q6_K head, Q4_K/Q6_K elsewhere (q/k/v in Q8_0: random K-quant blocks give q.k too
    # small for the rope factors to show in the logits)
    "phi3.5-mini": {"arch": "phi3", "vocab": "phi-3", "heads": 4, "kv": 4, "head_dim": 64, "rope_dim": 64,
                    "longrope": 32, "embd": "Q4_K", "output": "Q6_K",
                    "types": {"attn_qkv": "Q8_0", "attn_output": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K"}},
    # Phi-4-mini: partial rotary (48 of 64), grouped kv heads, LongRoPE, tied Q8_0 embedding
    "phi4-mini": {"arch": "phi3", "vocab": "phi-3", "heads": 4, "kv": 2, "head_dim": 64, "rope_dim": 48,
                  "longrope": 32, "embd": "Q8_0",
                  "types": {"attn_qkv": "Q8_0", "attn_output": "Q8_0", "ffn_up": "Q8_0", "ffn_down": "Q8_0"}},
    # Gemma 2: head size 128 (heads x head size != d), window 4 on even layers, attention and final
    # soft-capping (caps small enough to matter for random weights), tied Q6_K embedding
    "gemma2": {"arch": "gemma2", "vocab": "llama-spm", "heads": 4, "kv": 2, "head_dim": 128, "rope_dim": 128,
               "window": 4, "softcap": 0.5, "final_softcap": 200.0, "embd": "Q6_K",
               "types": {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K",
                         "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K"}},
    # Gemma 3: q/k norms, layer 0 local (window 4, base 10000), layer 1 global (base 1e6, linear x8)
    "gemma3": {"arch": "gemma3", "vocab": "llama-spm", "heads": 4, "kv": 2, "head_dim": 64, "rope_dim": 64,
               "window": 4, "pattern": 2, "theta": 1e6, "theta_swa": 10000.0, "linear": 8.0, "embd": "Q8_0",
               "qk_norm": True, "types": dict.fromkeys(("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                         "ffn_up", "ffn_down"), "Q8_0")},
}


def write(path: Path, c: dict[str, Any]) -> Path:
    from tests.llamacpp import source_reader, vocab

    rng = np.random.default_rng(3)
    arch, heads, kv, hd = c["arch"], c["heads"], c["kv"], c["head_dim"]
    src = source_reader(vocab(c["vocab"]))
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(c.get("context", CONTEXT))
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(c["rope_dim"])
    w.add_rope_freq_base(c.get("theta", 10000.0))
    w.add_layer_norm_rms_eps(1e-6)
    if "longrope" in c:
        w.add_rope_scaling_orig_ctx_len(c["longrope"])
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(CONTEXT / c["longrope"]) / np.log(c["longrope"]))))
    if arch == "phi3":   # llama.cpp ignores Phi-3's window (2047 in Phi-3-mini-4k); a small one shows the graph does too
        w.add_sliding_window(4)
    if "window" in c:
        w.add_sliding_window(c["window"])
    if "pattern" in c:
        w.add_sliding_window_pattern(c["pattern"])
    if "softcap" in c:
        w.add_attn_logit_softcapping(c["softcap"])
    if "final_softcap" in c:
        w.add_final_logit_softcapping(c["final_softcap"])
    if "theta_swa" in c:
        w.add_rope_freq_base_swa(c["theta_swa"])
    if c.get("linear"):
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(c["linear"])
    if "rope_scaling" in c:
        w.add_rope_scaling_type(c["rope_scaling"])
    for key, f in src.fields.items():
        if key.startswith("tokenizer.") and not (key == "tokenizer.chat_template" and "template" in c):
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    if "template" in c:   # a real chat template from llama.cpp's models/templates
        from tests.llamacpp import template

        w.add_chat_template(template(c["template"]))

    def mat(name: str, qtype: str, rows: int, cols: int) -> None:
        w.add_tensor(name, quantized_bytes(rng, qtype, rows, cols), raw_dtype=Q[qtype])

    def vec(name: str, n: int, lo: float = 0.8, hi: float = 1.2) -> None:
        w.add_tensor(name, rng.uniform(lo, hi, n).astype(np.float32))

    if "longrope" in c:
        vec("rope_factors_long.weight", c["rope_dim"] // 2, 1.0, 8.0)
        vec("rope_factors_short.weight", c["rope_dim"] // 2, 1.0, 2.0)
    mat("token_embd.weight", c["embd"], n_vocab, HIDDEN)
    q, k = heads * hd, kv * hd
    shapes = {"attn_qkv": (q + 2 * k, HIDDEN), "attn_q": (q, HIDDEN), "attn_k": (k, HIDDEN), "attn_v": (k, HIDDEN),
              "attn_output": (HIDDEN, q), "ffn_gate": (FFN, HIDDEN),
              "ffn_up": (2 * FFN if arch == "phi3" else FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    for i in range(LAYERS):
        norms = ["attn_norm", "ffn_norm"] + (["post_attention_norm", "post_ffw_norm"] if arch != "phi3" else [])
        for n in norms:
            vec(f"blk.{i}.{n}.weight", HIDDEN)
        for kind, qtype in c["types"].items():
            mat(f"blk.{i}.{kind}.weight", qtype, *shapes[kind])
        if c.get("qk_norm"):
            vec(f"blk.{i}.attn_q_norm.weight", hd)
            vec(f"blk.{i}.attn_k_norm.weight", hd)
    vec("output_norm.weight", HIDDEN)
    if "output" in c:
        mat("output.weight", c["output"], n_vocab, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference_logits(c: dict[str, Any], t: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """float64 logits of the last position, as llama.cpp computes them, from dequantized weights."""
    arch, heads, kv, hd, rd = c["arch"], c["heads"], c["kv"], c["head_dim"], c["rope_dim"]
    gemma, n = arch.startswith("gemma"), len(ids)

    def rms(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * wt

    def rope(x: np.ndarray, local: bool) -> np.ndarray:   # NEOX on the first rd dims of [n, heads, hd]
        theta, factors, mscale = c.get("theta", 10000.0), np.ones(rd // 2), 1.0
        if local:
            theta = c.get("theta_swa", theta)
        elif c.get("linear"):
            factors = factors * c["linear"]
        if "longrope" in c:
            factors = t["rope_factors_long.weight" if n > c["longrope"] else "rope_factors_short.weight"]
            mscale = np.sqrt(1 + np.log(CONTEXT / c["longrope"]) / np.log(c["longrope"]))
        ang = np.outer(np.arange(n), theta ** (-np.arange(0, rd, 2) / rd) / factors)
        cos, sin = np.cos(ang)[:, None] * mscale, np.sin(ang)[:, None] * mscale
        a, b = x[..., : rd // 2], x[..., rd // 2: rd]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos, x[..., rd:]], -1)

    x = t["token_embd.weight"][ids] * (np.sqrt(np.float32(HIDDEN)) if gemma else 1.0)
    pos = np.arange(n)
    for i in range(LAYERS):
        p = f"blk.{i}."
        local = "window" in c and (i % c.get("pattern", 2) < c.get("pattern", 2) - 1)
        h = rms(x, t[p + "attn_norm.weight"])
        if p + "attn_qkv.weight" in t:
            q, k, v = np.split(h @ t[p + "attn_qkv.weight"].T, [heads * hd, (heads + kv) * hd], -1)
        else:
            q, k, v = (h @ t[p + f"attn_{m}.weight"].T for m in "qkv")
        q, k, v = q.reshape(n, heads, hd), k.reshape(n, kv, hd), v.reshape(n, kv, hd)
        if c.get("qk_norm"):
            q, k = rms(q, t[p + "attn_q_norm.weight"]), rms(k, t[p + "attn_k_norm.weight"])
        q, k = rope(q, local) / np.sqrt(hd), rope(k, local)
        k, v = np.repeat(k, heads // kv, 1), np.repeat(v, heads // kv, 1)
        s = np.einsum("qhd,khd->hqk", q, k)
        if "softcap" in c:
            s = c["softcap"] * np.tanh(s / c["softcap"])
        hidden = pos[None, :] > pos[:, None]
        if local:
            hidden |= pos[:, None] - pos[None, :] >= c["window"]
        s = np.where(hidden, -np.inf, s)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", a, v).reshape(n, -1) @ t[p + "attn_output.weight"].T
        x = x + (rms(o, t[p + "post_attention_norm.weight"]) if gemma else o)
        h = rms(x, t[p + "ffn_norm.weight"])
        if gemma:
            g, u = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
            act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
        else:
            g, u = np.split(h @ t[p + "ffn_up.weight"].T, 2, -1)
            act = g / (1 + np.exp(-g))
        f = (act * u) @ t[p + "ffn_down.weight"].T
        x = x + (rms(f, t[p + "post_ffw_norm.weight"]) if gemma else f)
    out = rms(x[-1], t["output_norm.weight"]) @ t.get("output.weight", t["token_embd.weight"]).T
    cap = c.get("final_softcap")
    return cap * np.tanh(out / cap) if cap else out


def dequantized(path: Path) -> dict[str, np.ndarray]:
    r = gguf.GGUFReader(str(path))
    return {x.name: np.asarray(gguf.quants.dequantize(x.data, x.tensor_type), np.float64) for x in r.tensors}


@pytest.mark.parametrize("name", sorted(CASES))
def test_family_import_matches_numpy_reference(tmp_path: Path, name: str) -> None:
    c = CASES[name]
    path = write(tmp_path / f"{name}.gguf", c)
    assert streamable(preflight(path))   # ``models import`` takes this path at any file size
    report = import_gguf_streamed(path, tmp_path / "out")
    assert report["method"] == "gguf-exact-streamed" and report["max_weight_error"] <= 1e-6
    t = dequantized(path)
    ids, first = list(PROMPT), None
    for _ in range(NEW):
        ref = reference_logits(c, t, ids)
        first = ref if first is None else first
        ids.append(int(ref.argmax()))
    got_tokens = og_greedy(tmp_path / "out")   # also writes model.fp32.onnx (MatMulNBits in fp32)
    fp32 = tmp_path / "out" / "model.fp32.onnx"
    got = onnx_logits(fp32, np.array([PROMPT], np.int64), c["kv"], c["head_dim"])[0, -1]
    assert np.abs(got - first).max() / np.abs(first).max() < 2e-3
    assert got_tokens == ids[len(PROMPT):]
    if "longrope" in c or "window" in c:   # past the original context (long factors) or the window
        want = reference_logits(c, t, LONG_PROMPT)
        got = onnx_logits(fp32, np.array([LONG_PROMPT], np.int64), c["kv"], c["head_dim"])[0, -1]
        assert np.abs(got - want).max() / np.abs(want).max() < 2e-3


def test_unsupported_family_variant_is_refused_in_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gemma3 file with YaRN rope scaling is refused before anything is written, naming what
    the streamed import reads."""
    c = {**CASES["gemma3"], "linear": None, "rope_scaling": gguf.RopeScalingType.YARN}
    path = write(tmp_path / "yarn.gguf", c)
    reads = tensor_reads(monkeypatch)
    with pytest.raises(ModelError, match=r"rope.scaling.type 'yarn'.*supported: none, linear"):
        import_gguf_streamed(path, tmp_path / "out")
    assert reads == [] and not (tmp_path / "out").exists()
