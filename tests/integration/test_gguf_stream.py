"""The streamed GGUF import (graph from metadata, blocks streamed: models/gguf/fast.py) against
an independent numpy forward pass of gguf's own dequantized weights, per architecture.

The reference works in the file's own conventions (llama.cpp's interleaved RoPE on the
permuted Q/K rows of llama/mistral files, NEOX RoPE for qwen), so it shares no code with the
import. Greedy tokens must be equal with MatMulNBits computing in fp32 (accuracy_level 0),
and the logits within float rounding. Files are made with gguf-py (SmolLM2's tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
onnx = pytest.importorskip("onnx")

from tests.integration.test_gguf_exact import quantized_bytes
from tests.llamacpp import source_reader

from ortserve.errors import ModelError
from ortserve.models.gguf.fast import import_gguf_streamed
from ortserve.models.gguf_check import with_accuracy_level

Q = gguf.GGMLQuantizationType
HIDDEN, FFN, LAYERS, HEADS, KV, HEAD_DIM = 256, 512, 2, 4, 2, 64
PROMPT, NEW = [1, 504, 3458, 314, 260, 1345, 30], 6
MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
Q4_K_M = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K",
          "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K"}


def write(path: Path, arch: str, types: dict[str, str], *, embd: str, output: str | None = None,
          bias: bool = False, qk_norm: bool = False, rope_freqs: bool = False,
          rope_kv: dict[str, str | float | int] | None = None) -> Path:
    from ortserve.models.catalog import embedded_gguf

    rng = np.random.default_rng(1)
    src = source_reader(embedded_gguf())
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    for key, value in (rope_kv or {}).items():   # rope.scaling.type, .factor, ...
        add = w.add_string if isinstance(value, str) else w.add_uint32 if isinstance(value, int) else w.add_float32
        add(f"{arch}.{key}", value)
    w.add_layer_norm_rms_eps(1e-6)
    for key, f in src.fields.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)

    def mat(name: str, qtype: str, rows: int, cols: int) -> None:
        if qtype == "F16":
            w.add_tensor(name, rng.normal(0, 0.05, (rows, cols)).astype(np.float16))
        else:
            w.add_tensor(name, quantized_bytes(rng, qtype, rows, cols), raw_dtype=Q[qtype])

    def vec(name: str, n: int, lo: float = 0.8, hi: float = 1.2) -> None:
        w.add_tensor(name, rng.uniform(lo, hi, n).astype(np.float32))

    if rope_freqs:
        vec("rope_freqs.weight", HEAD_DIM // 2, 1.0, 8.0)
    mat("token_embd.weight", embd, vocab, HIDDEN)
    q, kv = HEADS * HEAD_DIM, KV * HEAD_DIM
    shapes = {"attn_q": (q, HIDDEN), "attn_k": (kv, HIDDEN), "attn_v": (kv, HIDDEN), "attn_output": (HIDDEN, q),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    for i in range(LAYERS):
        vec(f"blk.{i}.attn_norm.weight", HIDDEN)
        vec(f"blk.{i}.ffn_norm.weight", HIDDEN)
        for kind in MATS:
            mat(f"blk.{i}.{kind}.weight", types[kind], *shapes[kind])
        if bias:
            for t in "qkv":
                vec(f"blk.{i}.attn_{t}.bias", shapes[f"attn_{t}"][0], -0.5, 0.5)
        if qk_norm:
            vec(f"blk.{i}.attn_q_norm.weight", HEAD_DIM)
            vec(f"blk.{i}.attn_k_norm.weight", HEAD_DIM)
    vec("output_norm.weight", HIDDEN)
    if output:
        mat("output.weight", output, vocab, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dequantized(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    r = gguf.GGUFReader(str(path))
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    t = {x.name: np.asarray(gguf.quants.dequantize(x.data, x.tensor_type), np.float64) for x in r.tensors}
    t["rope"] = {k.removeprefix(f"{arch}.rope."): r.fields[k].contents() for k in r.fields
                 if k.startswith(f"{arch}.rope.")}   # scaling.type, scaling.factor, scale_linear, ...
    return arch, t


def rope_angles(rope: dict, n: int) -> tuple[np.ndarray, float]:
    """[n, HEAD_DIM/2] angles and the cos/sin magnitude, as llama.cpp's rope_yarn computes them
    per position (ggml-cpu/ops.cpp; llama-context.cpp for the magnitude), in float64."""
    kind = rope.get("scaling.type", "linear")
    factor = (rope.get("scaling.factor") or rope.get("scale_linear") or 1.0) if kind != "none" else 1.0
    extrap = np.outer(np.arange(n), 10000.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM))
    if kind != "yarn":   # llama.cpp scales cos/sin by rope.scaling.attn_factor whatever the type
        return extrap / factor, rope.get("scaling.attn_factor", 1.0)
    orig = rope["scaling.original_context_length"]

    def corr(beta: float) -> float:
        return HEAD_DIM * np.log(orig / (beta * 2 * np.pi)) / (2 * np.log(10000.0))

    low, high = max(0, np.floor(corr(32))), min(HEAD_DIM - 1, np.ceil(corr(1)))
    mix = 1 - np.clip((np.arange(0, HEAD_DIM, 2) // 2 - low) / max(0.001, high - low), 0, 1)
    theta = (extrap / factor) * (1 - mix) + extrap * mix
    return theta, rope.get("scaling.attn_factor", 1.0) * (1 + 0.1 * np.log(factor))


def reference_logits(arch: str, t: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """float64 logits of the last position, from gguf's dequantized weights, in numpy."""

    def rms(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * wt

    n = len(ids)
    ang, magnitude = rope_angles(t["rope"], n)
    ang = ang / t.get("rope_freqs.weight", 1.0)
    cos, sin = np.cos(ang) * magnitude, np.sin(ang) * magnitude

    def rope(x: np.ndarray) -> np.ndarray:   # [n, heads, d]
        if arch in ("llama", "mistral"):     # llama.cpp NORM: adjacent pairs
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = a * cos[:, None] - b * sin[:, None]
            out[..., 1::2] = a * sin[:, None] + b * cos[:, None]
            return out
        a, b = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]   # NEOX: halves
        return np.concatenate([a * cos[:, None] - b * sin[:, None], a * sin[:, None] + b * cos[:, None]], -1)

    x = t["token_embd.weight"][ids]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(LAYERS):
        p = f"blk.{i}."
        h = rms(x, t[p + "attn_norm.weight"])
        q, k, v = (h @ t[p + f"attn_{c}.weight"].T + t.get(p + f"attn_{c}.bias", 0.0) for c in "qkv")
        q, k, v = q.reshape(n, HEADS, HEAD_DIM), k.reshape(n, KV, HEAD_DIM), v.reshape(n, KV, HEAD_DIM)
        if p + "attn_q_norm.weight" in t:
            q, k = rms(q, t[p + "attn_q_norm.weight"]), rms(k, t[p + "attn_k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, HEADS // KV, 1), np.repeat(v, HEADS // KV, 1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(HEAD_DIM) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khd->qhd", a, v).reshape(n, -1) @ t[p + "attn_output.weight"].T
        h = rms(x, t[p + "ffn_norm.weight"])
        g = h @ t[p + "ffn_gate.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
    head = t.get("output.weight", t["token_embd.weight"])
    return rms(x[-1], t["output_norm.weight"]) @ head.T


def reference_greedy(path: Path) -> tuple[list[int], np.ndarray]:
    ids, first = list(PROMPT), None
    arch, t = dequantized(path)
    for _ in range(NEW):
        logits = reference_logits(arch, t, ids)
        first = logits if first is None else first
        ids.append(int(logits.argmax()))
    return ids[len(PROMPT):], first


def og_greedy(model_dir: Path) -> list[int]:
    """Greedy tokens of the imported model through onnxruntime-genai, MatMulNBits in fp32, the LM
    head in 16k-row slices as the import's fp32 reference has it (gguf_fast.fp32_compute_perplexity)."""
    import onnxruntime_genai as og

    check = with_accuracy_level(model_dir, 0, "model.fp32.onnx", split_rows=16384)
    cfg_path = model_dir / "genai_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["model"]["decoder"]["filename"] = check.name
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + NEW, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    return [int(x) for x in gen.get_sequence(0)][len(PROMPT):]


def first_logits(model_dir: Path, name: str = "model.fp32.onnx") -> np.ndarray:
    from ortserve.models.gguf_check import logits

    ids = np.array([PROMPT], np.int64)
    return logits(model_dir / name, ids, KV, HEAD_DIM)[0, -1]


CASES = {   # arch: (matrix types, writer options) -- each exercises a different part of the graph
    "llama": (Q4_K_M, {"embd": "Q6_K", "rope_freqs": True}),            # unfused q/k/v, tied Q6_K embedding
    "mistral": (dict.fromkeys(MATS, "Q4_0"), {"embd": "Q8_0", "output": "Q6_K"}),   # fused, untied head
    "qwen2": (Q4_K_M, {"embd": "Q4_K", "bias": True}),                 # per-projection biases, Q4_K minimums
    "qwen3": (dict.fromkeys(MATS, "Q8_0"), {"embd": "F16", "qk_norm": True}),   # fused + split + q/k norms
}


@pytest.mark.parametrize("arch", sorted(CASES))
def test_streamed_import_matches_numpy_reference(tmp_path: Path, arch: str) -> None:
    types, opts = CASES[arch]
    path = write(tmp_path / f"{arch}.gguf", arch, types, **opts)
    report = import_gguf_streamed(path, tmp_path / "out")
    assert report["method"] == "gguf-exact-streamed" and report["max_weight_error"] <= 1e-6
    graph = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    sums = [n for n in graph.graph.node if n.name.endswith(("/gguf_blocksum32", "/gguf_blocksum16"))]
    assert all(n.op_type == "ReduceSum" for n in sums)   # block sums read no weights (docs/scale.md)
    assert (len(sums) > 0) == (types["attn_q"] == "Q4_K")   # the minimum term is there exactly for Q4_K
    want_tokens, want_logits = reference_greedy(path)
    got_tokens = og_greedy(tmp_path / "out")
    got = first_logits(tmp_path / "out")
    graph = onnx.load(str(tmp_path / "out" / "model.fp32.onnx"), load_external_data=False)
    assert sum(n.name.startswith("/lm_head/") and n.op_type == "MatMulNBits" for n in graph.graph.node) in (0, 3)
    whole = with_accuracy_level(tmp_path / "out", 0, "model.whole.onnx")   # the head unsplit: same logits
    assert np.abs(got - first_logits(tmp_path / "out", whole.name)).max() <= 1e-6 * np.abs(got).max()
    assert np.abs(got - want_logits).max() / np.abs(want_logits).max() < 2e-3
    assert got_tokens == want_tokens


def tensor_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tensors whose data an import decodes from here on (ours: GGUFWeights.form/dense and the
    streamed chunks). "Refused in seconds" is checked as this decision, an empty list, never as a
    duration: a loaded machine takes longer to read a header, not a different path."""
    from ortserve.models.gguf import stream as gguf_stream
    from ortserve.models.gguf.reader import GGUFWeights

    reads: list[str] = []
    for owner, attr in ((GGUFWeights, "form"), (GGUFWeights, "dense"), (gguf_stream, "form_chunks"),
                        (gguf_stream, "vector")):
        real = getattr(owner, attr)

        def spy(*args: object, _real: object = real, _attr: str = attr, **kw: object) -> object:
            reads.append(f"{_attr}({args[1] if len(args) > 1 else ''})")
            return _real(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(owner, attr, spy)
    return reads


def test_unsupported_architecture_is_refused_in_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``models import`` refuses an unknown architecture from the header; the streamed path
    refuses one it does not write (the importer then takes the transformers path)."""
    from ortserve.models.importer import import_gguf
    from ortserve.models.store import ModelStore

    def models_import(path: Path) -> None:
        import_gguf(ModelStore(tmp_path / "home"), path, "x")

    def streamed(path: Path) -> None:
        import_gguf_streamed(path, tmp_path / "out")

    for arch, where, call in (("falcon", "hint", models_import), ("lfm2", "message", streamed)):
        path = write(tmp_path / f"{arch}.gguf", arch, dict.fromkeys(MATS, "Q4_0"), embd="F16")
        reads = tensor_reads(monkeypatch)
        with pytest.raises(ModelError) as err:
            call(path)
        assert reads == [] and not (tmp_path / "out").exists()
        text = err.value.hint if where == "hint" else str(err.value)
        assert arch in str(err.value) and "llama" in text and "qwen3" in text


def test_iq4_files_import_exactly(tmp_path: Path) -> None:
    """IQ4_XS (llama-quantize's IQ4_XS keeps some matrices IQ4_NL): 4-bit indices into int8
    levels, held exactly as 8-bit codes; greedy tokens and logits as the dequantized reference."""
    types = {**dict.fromkeys(MATS, "IQ4_XS"), "attn_v": "IQ4_NL", "ffn_down": "IQ4_NL"}
    path = write(tmp_path / "iq4.gguf", "llama", types, embd="IQ4_XS", rope_freqs=True)
    report = import_gguf_streamed(path, tmp_path / "out")
    assert report["max_weight_error"] <= 1e-6 and set(report["gguf_types"]) == {"IQ4_XS", "IQ4_NL"}
    want_tokens, want_logits = reference_greedy(path)
    assert og_greedy(tmp_path / "out") == want_tokens    # at fp32 compute: writes model.fp32.onnx
    got = first_logits(tmp_path / "out")
    assert np.abs(got - want_logits).max() / np.abs(want_logits).max() < 2e-3


ROPE_CASES = {   # name: (arch, rope keys) -- llama.cpp's rope scaling, as the file says it
    "linear": ("llama", {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}),   # beside rope_freqs
    # the older key, the type defaulting to linear, and an attention factor (cos/sin x 1.3)
    "scale_linear": ("qwen2", {"rope.scale_linear": 2.0, "rope.scaling.attn_factor": 1.3}),
    "yarn": ("llama", {"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0,
                       "rope.scaling.original_context_length": 32, "rope.scaling.attn_factor": 0.9}),
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rope_scaling_is_read_as_llama_cpp_reads_it(tmp_path: Path, case: str) -> None:
    """Linear factors divide the positions; YaRN mixes interpolated and extrapolated angles by a
    ramp and scales cos/sin (the reference computes llama.cpp's rope_yarn per position)."""
    arch, rope = ROPE_CASES[case]
    types = dict.fromkeys(MATS, "Q8_0")
    path = write(tmp_path / "scaled.gguf", arch, types, embd="Q8_0", rope_freqs=arch == "llama", rope_kv=rope)
    import_gguf_streamed(path, tmp_path / "out")
    want_tokens, want_logits = reference_greedy(path)
    assert og_greedy(tmp_path / "out") == want_tokens
    got = first_logits(tmp_path / "out")
    assert np.abs(got - want_logits).max() / np.abs(want_logits).max() < 2e-3
    plain = write(tmp_path / "plain.gguf", arch, types, embd="Q8_0", rope_freqs=arch == "llama")
    unscaled = reference_logits(*dequantized(plain), list(PROMPT))
    assert np.abs(unscaled - want_logits).max() / np.abs(want_logits).max() > 1e-2   # the scaling matters here


def test_an_unknown_rope_scaling_is_refused_in_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ortserve.models.importer import import_gguf
    from ortserve.models.store import ModelStore

    path = write(tmp_path / "lr.gguf", "llama", dict.fromkeys(MATS, "Q8_0"), embd="Q8_0",
                 rope_kv={"rope.scaling.type": "longrope", "rope.scaling.factor": 4.0})
    reads = tensor_reads(monkeypatch)
    with pytest.raises(ModelError, match=r"rope.scaling.type 'longrope' is not supported.*none, linear, yarn"):
        import_gguf(ModelStore(tmp_path / "home"), path, "y")
    assert reads == [] and not list((tmp_path / "home").rglob("*.onnx"))   # one header read


def test_unsupported_block_type_is_refused_before_any_work(tmp_path: Path) -> None:
    path = write(tmp_path / "iq.gguf", "llama", {**dict.fromkeys(MATS, "Q4_0"), "ffn_down": "IQ3_XXS"}, embd="F16")
    with pytest.raises(ModelError, match=r"IQ3_XXS.*supported: Q4_0, Q4_1"):
        import_gguf_streamed(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
