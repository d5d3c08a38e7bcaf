"""Exact GGUF import in the file's own memory: graph from metadata, blocks streamed.

``import_gguf_streamed`` writes an ONNX GenAI directory from a Llama-family GGUF without
transformers' dequantized model or the builder (gguf_graph writes the graph, gguf_stream
the weights), so an import takes seconds per GB and about the file's size in memory:
the GGUF is memory-mapped, and at any moment one node's rows are being decoded.

What it checks on the way: the first rows of every matrix decode to gguf's own
dequantization (relative error <= 1e-6), and the finished model runs a short input to finite
logits. The graph itself (rotary, attention, norms, the minimum terms) is checked by the
tests against the builder's fp32 reference on small files (tests/integration/test_gguf_scale.py).
"""

from __future__ import annotations

import gc
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError
from ortserve.models.gguf.families import FAMILY_ARCHITECTURES, genai_type, refuse_unsupported, writer_for
from ortserve.models.gguf.graph import STREAM_ARCHITECTURES, Spec
from ortserve.models.gguf.native import NativeOps, Plan, install_library, uses_native, weight_bytes_per_token
from ortserve.models.gguf.reader import GGUFWeights, _field, count_types, preflight
from ortserve.models.gguf.rope import scales_rope
from ortserve.models.gguf.stream import DataFile
from ortserve.models.gguf_vocab import fit_tokenizer, keep_fim_ids
from ortserve.models.quality import release_freed_memory
from ortserve.models.validate import gguf_metadata

Progress = Callable[[str], None]
GRAPH_VERSION = 3   # exact.GRAPH_VERSIONS: 3 = written from metadata, blocks streamed


def refuse_early(gguf_path: Path) -> None:
    """Refuse another architecture from the bounds-checked header alone (under a second, before
    gguf's reader parses the vocabulary), naming the architectures this path writes."""
    from ortserve.models.validate import check_gguf

    arch = check_gguf(gguf_path)["gguf_architecture"]
    if arch not in STREAM_ARCHITECTURES:
        raise ModelError(f"{gguf_path.name}: the streamed GGUF import writes {', '.join(STREAM_ARCHITECTURES)}, "
                         f"not {arch} (supported: {', '.join(STREAM_ARCHITECTURES)})",
                         hint="ortserve models import uses the transformers path for the other architectures")


# Below this size the transformers path's 20x the file is affordable, and its graph (the ONNX
# Runtime GenAI builder's) is the measured one: on the default 135M model its perplexity is the
# fp32-compute reference's to 0.003%, the streamed graph's 0.09-0.19% above: int8 activation
# rounding noise (docs/gguf.md, "Where the 0.19% comes from"; 0.09% since its block sums are ReduceSum).
STREAM_MIN_BYTES = 256 << 20


def streamable(weights: GGUFWeights) -> bool:
    """Whether this file takes the streamed path: its architecture's graph is written here, and
    the file is large enough (``STREAM_MIN_BYTES``) that the transformers path's memory matters.
    phi3 and gemma2/3 take it at any size: the builder-patching exact path does not map them,
    nor does it read rope scaling, so a file with any takes it too (it is read or refused there)."""
    if weights.arch in FAMILY_ARCHITECTURES:
        return True
    if weights.arch in STREAM_ARCHITECTURES and scales_rope(weights):
        return True
    return weights.arch in STREAM_ARCHITECTURES and weights.path.stat().st_size >= STREAM_MIN_BYTES


def drop_vocabulary(weights: GGUFWeights) -> None:
    """Let go of the parsed vocabulary arrays (tokens, scores, types, merges) before the weights
    stream: gguf's reader keeps a numpy view per entry, about 1.2 GB for Gemma's 262k tokens
    (more than a small model's file). The tokenizer is read from the file again at the end."""
    import gc

    fields = weights.reader.fields
    for key in [k for k, f in fields.items() if k.startswith("tokenizer.ggml.") and len(f.data) > 1]:
        del fields[key]
    gc.collect()


def genai_config(spec: Spec, weights: GGUFWeights) -> dict[str, Any]:
    r = weights.reader
    eos = int(_field(r, "tokenizer.ggml.eos_token_id", 0))
    return {"model": {
        "bos_token_id": int(_field(r, "tokenizer.ggml.bos_token_id", eos)),
        "context_length": spec.context,
        "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "filename": "model.onnx", "head_size": spec.head_dim, "hidden_size": spec.hidden,
            "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                       "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
            "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                        "present_value_names": "present.%d.value"},
            "num_attention_heads": spec.heads, "num_hidden_layers": spec.layers,
            "num_key_value_heads": spec.kv_heads},
        "eos_token_id": eos, "pad_token_id": int(_field(r, "tokenizer.ggml.padding_token_id", eos)),
        "type": genai_type(spec.arch), "vocab_size": spec.vocab},
        "search": {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
                   "max_length": spec.context, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 50, "top_p": 1.0}}


def write_tokenizer(gguf_path: Path, out_dir: Path, rows: int) -> list[str]:
    """tokenizer.json, its config and the chat template, from the GGUF's metadata only, naming
    no id at or past the model's ``rows`` (gguf_vocab.fit_tokenizer). Returns the files' names."""
    import os

    before = {p.name for p in out_dir.iterdir()}

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelError(f"cannot read the tokenizer of {gguf_path.name}: {exc}".splitlines()[0]) from exc
    tok.save_pretrained(str(out_dir))
    fit_tokenizer(out_dir, rows)
    keep_fim_ids(gguf_metadata(gguf_path), out_dir)  # its fill-in-the-middle tokens, where the file names them
    return sorted({p.name for p in out_dir.iterdir()} - before)


def smoke_logits(model_dir: Path, spec: Spec, n_tokens: int = 8) -> float:
    """Run a few tokens through the finished graph; refuse non-finite logits. Returns max |logit|."""
    from ortserve.models.gguf_check import logits

    ids = np.random.default_rng(0).integers(0, spec.vocab, (1, n_tokens), dtype=np.int64)
    out = logits(model_dir / "model.onnx", ids, spec.kv_heads, spec.head_dim)
    if not np.isfinite(out).all():
        raise ModelError("the imported model computes non-finite logits")
    return float(np.abs(out).max())


def import_gguf_streamed(gguf_path: Path, out_dir: Path, *, progress: Progress | None = None,
                         smoke: bool = True, native: Plan | None = None,
                         tokenizer_from: tuple[Path, list[str]] | None = None) -> dict[str, Any]:
    """Write the exact ONNX GenAI model of ``gguf_path`` into ``out_dir``; returns the report.
    ``native`` (a usable native.Plan): the matrices its library reads go on its GgufMatMul /
    GgufGather ops, and the library is copied into ``out_dir`` and named in genai_config.json.
    ``tokenizer_from``: (folder, names) of the same file's tokenizer, already written by an
    earlier call (its report's ``tokenizer_files``), copied instead of converted again."""
    import onnx

    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    gguf_path = Path(gguf_path)
    refuse_early(gguf_path)
    weights = preflight(gguf_path)
    drop_vocabulary(weights)
    spec = Spec.of(weights, weights.reader)
    refuse_unsupported(weights, spec)   # a family variant this graph does not write: before any output
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"writing the {spec.layers}-layer graph and streaming the GGUF blocks")
    data = DataFile(out_dir / "model.onnx.data")
    try:
        writer = writer_for(spec.arch)(weights, spec, data)
        writer.native = NativeOps(native) if native is not None and native.use else None
        model = writer.build()
    finally:
        data.close()
    onnx.save_model(model, str(out_dir / "model.onnx"))
    kernels = "gguf-native" if uses_native(model) else "matmulnbits"
    read = weight_bytes_per_token(model)
    del model
    report, checks = writer.report, writer.checks
    writer_native_nodes = writer.native.nodes if writer.native is not None else 0
    config = genai_config(spec, weights)
    if kernels == "gguf-native" and native is not None:   # onnxruntime-genai loads it from the folder
        config["model"]["decoder"]["session_options"]["custom_ops_library"] = install_library(native, out_dir)
    del writer, weights   # unmap the GGUF before onnxruntime maps the new weights (peak RSS)
    gc.collect()
    release_freed_memory()
    t_graph = time.monotonic() - t0
    if tokenizer_from is None:
        tokenizer_files = write_tokenizer(gguf_path, out_dir, spec.vocab)
    else:
        tokenizer_files = tokenizer_from[1]
        for name in tokenizer_files:
            shutil.copy2(tokenizer_from[0] / name, out_dir / name)
    (out_dir / "genai_config.json").write_text(json.dumps(config, indent=4), encoding="utf-8")
    release_freed_memory()   # the tokenizer's conversion leaves its freed heap behind too
    peak = smoke_logits(out_dir, spec) if smoke else None
    types = count_types(report)
    say(f"exact: {checks.tensors} tensors checked against gguf's dequantization, "
        f"max error {checks.max_error:.2g}; written in {t_graph:.1f}s")
    return {"method": "gguf-exact-streamed", "graph_version": GRAPH_VERSION, "gguf_types": types,
            "nodes": len(report), "folded_minimums": sum(n["offsets"] for n in report),
            "max_weight_error": checks.max_error, "checked_tensors": checks.tensors,
            "smoke_max_logit": peak, "seconds": round(time.monotonic() - t0, 2), "kernels": kernels,
            "weight_bytes_per_token": read, "tokenizer_files": tokenizer_files,
            **({"native_isa": native.isa, "native_nodes": writer_native_nodes} if kernels == "gguf-native" else {})}


def fp32_compute_perplexity(model_dir: Path) -> float:
    """The reference perplexity: the same exact weights with MatMulNBits computing in fp32
    (accuracy_level 0), which is the dequantized fp32 model up to float summation order,
    measured without ever writing that model."""
    from ortserve.models.gguf_check import with_accuracy_level
    from ortserve.models.quality import perplexity

    cfg_path = model_dir / "genai_config.json"
    original = cfg_path.read_text(encoding="utf-8")
    # the LM head in 16k-row slices: at fp32 compute an 8-bit head is dequantized whole per run
    check = with_accuracy_level(model_dir, 0, "model.fp32-compute.onnx", split_rows=16384)
    try:
        cfg = json.loads(original)
        cfg["model"]["decoder"]["filename"] = check.name
        cfg_path.write_text(json.dumps(cfg, indent=4), encoding="utf-8")
        return float(perplexity(model_dir)["perplexity"])
    finally:
        cfg_path.write_text(original, encoding="utf-8")
        check.unlink(missing_ok=True)
