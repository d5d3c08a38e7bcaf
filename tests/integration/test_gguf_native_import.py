"""The exact GGUF import on ortserve's GGUF-native kernels (models/gguf/native.py, issue 41).

Where the native library is active, the graph holds ``GgufMatMul``/``GgufGather`` on the file's
own rows (the initializers' bytes are the file's tensor bytes) and no MatMulNBits; with the
library switched off (ORTSERVE_NATIVE=0) the same import writes today's MatMulNBits graph. The
tiny random files of test_gguf_stream.py cover each architecture's graph parts against the numpy
reference; the default model (SmolLM2-135M Q4_1) is checked for its manifest, its bytes, greedy
tokens against the MatMulNBits graph, LoRA and speculation's verify step.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
onnx = pytest.importorskip("onnx")

from tests.integration.test_gguf_stream import (
    CASES,
    HEAD_DIM,
    KV,
    PROMPT,
    dequantized,
    reference_logits,
    write,
)

from ortserve.engine.lora import Adapter
from ortserve.engine.runner import ModelSpec, Runner
from ortserve.models.catalog import embedded_gguf
from ortserve.models.gguf.exact import gguf_tensor_names
from ortserve.models.gguf.fast import import_gguf_streamed
from ortserve.models.gguf.native import plan
from ortserve.models.gguf.native_import import SHIPPED_FACTOR, kernels_stale, logit_check, try_native
from ortserve.models.gguf.reader import GGUFWeights
from ortserve.models.gguf_check import logits

NATIVE = plan()
pytestmark = pytest.mark.skipif(not NATIVE.use, reason=f"GGUF-native kernels not active: {NATIVE.reason}")


def graph_of(model_dir: Path) -> Any:
    return onnx.load(str(model_dir / "model.onnx"), load_external_data=False)


def initializer_bytes(model_dir: Path, model: Any, name: str) -> bytes:
    t = next(t for t in model.graph.initializer if t.name == name)
    ext = {e.key: e.value for e in t.external_data}
    with (model_dir / ext["location"]).open("rb") as f:
        f.seek(int(ext.get("offset", 0)))
        return f.read(int(ext["length"]))


def file_rows(weights: GGUFWeights, names: tuple[str, ...]) -> bytes:
    """The file's rows of ``names``, concatenated; llama.cpp's Q/K row order undone (whole rows)."""
    out = []
    for n in names:
        t = weights.tensors[n]
        rows = int(t.shape[1])
        raw = np.asarray(t.data, np.uint8).reshape(rows, -1)
        perm = weights.row_permutation(n, rows)
        out.append(raw if perm is None else raw[perm])
    return np.concatenate(out).tobytes()


def native_nodes(model: Any, weights: GGUFWeights) -> dict[str, tuple[str, ...]]:
    """Each native op's weight initializer -> the GGUF tensors it holds."""
    out = {}
    for n in model.graph.node:
        if n.op_type == "GgufGather":
            out[n.input[0]] = out.get(n.input[0], ("token_embd.weight",))
        elif n.op_type == "GgufMatMul":
            names = gguf_tensor_names(n.name, weights)
            assert names is not None, n.name
            out[n.input[1]] = names
    return out


def assert_files_bytes(model_dir: Path, gguf_path: Path) -> dict[str, tuple[str, ...]]:
    model, weights = graph_of(model_dir), GGUFWeights.open(gguf_path)
    nodes = native_nodes(model, weights)
    for init, names in nodes.items():
        assert initializer_bytes(model_dir, model, init) == file_rows(weights, names), (init, names)
    return nodes


# two small files: (llama) Q4_K q/k beside a Q3_K v the kernels do not read (it stays MatMulNBits,
# per tensor), Q5_K o, fused Q5_1 gate/up, Q6_K down, a tied Q4_1 embedding; (mistral) everything
# fused at Q4_0, an untied Q6_K head and a Q8_0 embedding.
NATIVE_CASES = {
    "llama": ("llama", {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q3_K", "attn_output": "Q5_K",
                        "ffn_gate": "Q5_1", "ffn_up": "Q5_1", "ffn_down": "Q6_K"}, {"embd": "Q4_1", "rope_freqs": True}),
    "mistral": ("mistral", *CASES["mistral"]),
}


@pytest.mark.parametrize("case", sorted(NATIVE_CASES))
def test_native_graph_reads_the_files_rows(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ortserve.models.gguf import fast as gguf_fast

    monkeypatch.setattr(gguf_fast, "write_tokenizer", lambda *a: [])   # graphs only: no tokenizer conversion
    arch, types, opts = NATIVE_CASES[case]
    path = write(tmp_path / f"{arch}.gguf", arch, types, **opts)
    report = import_gguf_streamed(path, tmp_path / "native", native=NATIVE)
    import_gguf_streamed(path, tmp_path / "mnb")
    assert report["kernels"] == "gguf-native" and report["native_isa"] == NATIVE.isa
    model = graph_of(tmp_path / "native")
    ops = Counter(n.op_type for n in model.graph.node)
    fallback = [n.name for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert fallback == [f"/model/layers.{i}/attn/v_proj/MatMul_Q4" for i in range(2) if types["attn_v"] == "Q3_K"]
    assert ops["GgufMatMul"] > 0
    assert any(o.domain == "ortserve.gguf" and o.version == 1 for o in model.opset_import)
    nodes = assert_files_bytes(tmp_path / "native", path)
    heads = [n for n in model.graph.node if n.name.startswith("/lm_head/")]
    gather = [n for n in model.graph.node if n.op_type == "GgufGather"]
    if "output" not in opts:   # tied: the embedding and the LM head read one initializer
        assert [g.input[0] for g in gather] == [heads[0].input[1]]
    else:
        assert len(gather) == (opts["embd"] != "F16") and heads[0].input[1] not in [g.input[0] for g in gather]
    # q/k/v fused exactly when they share one block type (Q4_K_M: Q4_K q/k and Q6_K v stay apart)
    fused = {types[f"attn_{t}"] for t in "qkv"}
    assert any("qkv_proj" in i for i in nodes) == (len(fused) == 1)
    # logits: as close to the dequantized reference as the MatMulNBits graph's int8 activations are
    got = logits(tmp_path / "native" / "model.onnx", np.array([PROMPT]), KV, HEAD_DIM)[0, -1]
    shipped = logits(tmp_path / "mnb" / "model.onnx", np.array([PROMPT]), KV, HEAD_DIM)[0, -1]
    want = reference_logits(*dequantized(path), PROMPT)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() / scale <= max(2e-3, SHIPPED_FACTOR * np.abs(shipped - want).max() / scale)
    assert logit_check(tmp_path / "native", tmp_path / "mnb")["ok"]


# ---- the default model ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The store's default model (imported on the native kernels when they are active: the import
    re-imports a MatMulNBits variant once they are) and, beside it, the streamed MatMulNBits graph of
    the same GGUF written with the library switched off."""
    mnb = tmp_path_factory.mktemp("native-off") / "model"
    from ortserve.models.gguf import fast as gguf_fast

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORTSERVE_NATIVE", "0")
        mp.setattr(gguf_fast, "write_tokenizer", lambda *a: [])   # the runner needs none: graph and config
        off = plan()
        report = import_gguf_streamed(embedded_gguf(), mnb, native=off)
    manifest = json.loads((default_model / "ortserve.json").read_text(encoding="utf-8"))
    return SimpleNamespace(native=default_model, mnb=mnb, off=off, off_report=report, manifest=manifest)


def test_default_model_runs_the_files_blocks(smollm2: SimpleNamespace) -> None:
    exact = smollm2.manifest["notes"]["gguf_exact"]
    assert exact["kernels"] == "gguf-native" and exact["native_isa"] == NATIVE.isa, exact
    assert exact["logit_error"]["ok"] and "native_refused" not in exact
    model = graph_of(smollm2.native)
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["MatMulNBits"] == 0 and ops["GgufGather"] == 1 and ops["GgufMatMul"] == 30 * 4 + 1
    cfg = json.loads((smollm2.native / "genai_config.json").read_text(encoding="utf-8"))
    lib = cfg["model"]["decoder"]["session_options"]["custom_ops_library"]
    assert (smollm2.native / lib).is_file() and "/" not in lib    # inside the folder, by its name
    nodes = assert_files_bytes(smollm2.native, embedded_gguf())
    weights = GGUFWeights.open(embedded_gguf())
    file_bytes = sum(int(t.n_bytes) for t in weights.tensors.values() if len(t.shape) == 2)
    held = sum(len(file_rows(weights, names)) for names in nodes.values())
    assert held == file_bytes    # every matrix once: the tied head and the embedding share one copy
    # per token: every matrix once, plus one embedding row; the MatMulNBits graph reads more
    assert exact["weight_bytes_per_token"] < smollm2.off_report["weight_bytes_per_token"]


def test_switched_off_the_import_writes_todays_graph(smollm2: SimpleNamespace, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert not smollm2.off.use and "ORTSERVE_NATIVE=0" in smollm2.off.reason
    assert smollm2.off_report["kernels"] == "matmulnbits"
    ops = Counter(n.op_type for n in graph_of(smollm2.mnb).graph.node)
    assert ops["MatMulNBits"] > 0 and ops["GgufMatMul"] == ops["GgufGather"] == 0
    cfg = json.loads((smollm2.mnb / "genai_config.json").read_text(encoding="utf-8"))
    assert "custom_ops_library" not in cfg["model"]["decoder"]["session_options"]
    monkeypatch.setenv("ORTSERVE_NATIVE", "0")
    report, ref, why = try_native(embedded_gguf(), tmp_path)
    assert report is None and ref is None and "ORTSERVE_NATIVE=0" in why["native_off"]
    # a native variant is re-imported on today's graph, and back once the kernels are on again
    assert kernels_stale({"kernels": "gguf-native"}) and not kernels_stale({"kernels": "matmulnbits"})
    monkeypatch.delenv("ORTSERVE_NATIVE")
    assert kernels_stale({"kernels": "matmulnbits"}) and not kernels_stale({"kernels": "gguf-native"})
    assert not kernels_stale({"kernels": "matmulnbits", "native_refused": "logits differ"})


def greedy(runner: Runner, prompt: list[int], n: int) -> list[int]:
    out = [int(np.argmax(runner.prefill(0, prompt)))]
    for _ in range(n - 1):
        out.append(int(np.argmax(runner.decode(np.array([out[-1]]))[0])))
    runner.clear(0)
    return out


PROMPTS = ([1, 504, 3458, 314, 260, 1345, 30], [1, 504, 3032, 282, 4649, 314], [504, 1345, 30, 260, 3458])
TEXTS = ("def fibonacci(n):", "1, 2, 3, 4, 5,", "The capital of France is", "Once upon a time, there was a")
NEAR = 1.0   # logits: int8 activations (both graphs') move a logit by up to ~0.6 here


def test_greedy_tokens_follow_the_fp32_reference(smollm2: SimpleNamespace, tmp_path: Path) -> None:
    """Teacher-forced along the fp32 reference's greedy tokens (the MatMulNBits graph at fp32 compute),
    the native graph picks, at every step, a token the reference scores within NEAR of its best (where
    the reference has no near tie, that is its own token); on the first two texts, which have none,
    the greedy tokens of the native graph, the MatMulNBits graph and the reference are equal."""
    from ortserve.engine.tokenizer import TextCodec
    from ortserve.models.gguf_check import with_accuracy_level

    ref_dir = tmp_path / "fp32"
    ref_dir.mkdir()
    with_accuracy_level(smollm2.mnb, 0, out_dir=ref_dir)
    native, mnb, ref = (Runner(ModelSpec.read(d), slots=1) for d in (smollm2.native, smollm2.mnb, ref_dir))
    assert native.last_logits_only   # the LM head (a GgufMatMul) is found: logits for the asked positions only
    codec = TextCodec(smollm2.native)
    for i, text in enumerate(TEXTS):
        prompt = codec.encode(text)
        got, want = native.prefill(0, prompt), ref.prefill(0, prompt)
        for _ in range(8):
            assert want[int(got.argmax())] >= want.max() - NEAR, text
            tok = np.array([int(want.argmax())])
            got, want = native.decode(tok)[0].copy(), ref.decode(tok)[0].copy()
        native.clear(0)
        ref.clear(0)
        if i < 2:
            assert greedy(native, prompt, 8) == greedy(mnb, prompt, 8) == greedy(ref, prompt, 8), text


def test_onnxruntime_genai_loads_the_library_from_the_folder(smollm2: SimpleNamespace) -> None:
    """genai_config.json's session_options.custom_ops_library, the library's file name inside the
    folder, is what onnxruntime-genai 0.18 loads: its greedy tokens are the runner's."""
    import onnxruntime_genai as og

    prompt = PROMPTS[1]
    model = og.Model(str(smollm2.native))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 6, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    while not gen.is_done():
        gen.generate_next_token()
    got = [int(x) for x in gen.get_sequence(0)][len(prompt):]
    assert got == greedy(Runner(ModelSpec.read(smollm2.native), slots=1), prompt, 6)


def test_speculation_verify_equals_decode_steps(smollm2: SimpleNamespace) -> None:
    runner = Runner(ModelSpec.read(smollm2.native), slots=2)
    prompt = PROMPTS[0]
    first = int(np.argmax(runner.prefill(0, prompt)))
    steps, tok = [], first
    for _ in range(3):
        steps.append(runner.decode(np.array([tok]))[0].copy())   # decode's logits live in one buffer
        tok = int(np.argmax(steps[-1]))
    fed = [first] + [int(np.argmax(s)) for s in steps[:2]]
    runner.keep(0, len(prompt))     # back to the prompt: verify the three tokens in one step
    got = runner.verify([fed])[0]
    for g, s in zip(got, steps):   # the same logits up to activation rounding (MatMulNBits' differ as much:
        assert s[int(g.argmax())] >= s.max() - NEAR     # 0.02-0.04 here): the same pick but at a near tie
        assert np.abs(g - s).max() <= 0.1 * np.abs(s).max()


def test_lora_terms_land_on_the_native_projections(smollm2: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    from ortserve.engine import graph as graph_edits

    spec = ModelSpec.read(smollm2.native)
    plain_runner = Runner(spec, slots=1)
    # every layer's SwiGLU goes into its down_proj; its skip-norms are the library's (engine/graph.py:
    # layer 0's input norm has no skip, the final norm has one)
    assert plain_runner.native_edits == {"swiglu": 30, "norm": 60}
    runner = Runner(spec, slots=2, lora=True)
    assert len(runner.lora_targets) == 30 * 4    # qkv, o, gate_up and down of every layer
    # a down_proj term reads the SwiGLU product, so each layer keeps its nodes (engine/graph.py fuse_swiglu)
    assert runner.native_edits == {"swiglu": 0, "norm": 60}
    rng = np.random.default_rng(0)
    weights = {f"layers.{t.layer}.{name}": (rng.normal(0, 0.05, (t.inputs, 4)).astype(np.float32),
                                            rng.normal(0, 0.05, (4, width)).astype(np.float32))
               for t in runner.lora_targets for name, width in t.parts}
    runner.set_adapters([Adapter("noise", weights, {"scale": 1.0})])
    # the same graph without the LoRA terms: the SwiGLU unfolded too, so a row with no adapter equals it
    monkeypatch.setattr(graph_edits, "fuse_swiglu", lambda *a: 0)
    plain = Runner(spec, slots=1).prefill(0, PROMPTS[1])
    base = runner.prefill(1, PROMPTS[1])          # row 1: no adapter
    runner.use_adapter(0, "noise")
    tuned = runner.prefill(0, PROMPTS[1])
    scale = np.abs(plain).max()
    assert np.abs(base - plain).max() <= 1e-5 * scale
    assert np.abs(tuned - plain).max() > 1e-2 * scale


def test_a_wrong_native_graph_is_refused_and_todays_graph_written(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The import's check is what stands between a kernel or layout error and a shipped model: with
    llama.cpp's Q/K row order left as the file has it (a plausible layout slip), try_native refuses the
    native graph, says why, and leaves the directory empty for today's graph."""
    from ortserve.models.gguf import fast as gguf_fast
    from ortserve.models.gguf.native import NativeOps

    monkeypatch.setattr(gguf_fast, "write_tokenizer", lambda *a: [])
    real = NativeOps.raw

    def unpermuted(self: NativeOps, data: Any, w: GGUFWeights, names: tuple[str, ...], base: str) -> Any:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(type(w), "row_permutation", lambda *a: None)
            return real(self, data, w, names, base)

    monkeypatch.setattr(NativeOps, "raw", unpermuted)
    types, opts = CASES["mistral"]
    path = write(tmp_path / "mistral.gguf", "mistral", types, **opts)
    out = tmp_path / "out"
    out.mkdir()
    said: list[str] = []
    report, ref, why = try_native(path, out, said.append)
    assert report is None and ref is None and "native logits differ" in why["native_refused"], why
    assert list(out.iterdir()) == [] and not (tmp_path / "out.native").exists()
    assert any(m.endswith("using the MatMulNBits graph") for m in said), said
