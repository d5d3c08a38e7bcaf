"""Building an embedding variant (torch: the ``convert`` extra, imported inside functions only)
and measuring it: the ONNX export of a sentence-transformers folder, dynamic int8, the PyTorch
reference vectors, cosine agreement with them, and speed.

``embed_import.py`` installs what these build; ``ortserve.models.embed_import`` re-exports them.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np


def check_source(src: Path) -> None:
    """A Hugging Face folder to export: its tokenizer.json and its weights, or a ModelError."""
    from ortserve.errors import ModelError

    if not (src / "tokenizer.json").is_file():
        raise ModelError(f"{src} has no tokenizer.json", hint="copy the model's tokenizer files too")
    if not any(src.glob("*.safetensors")) and not any(src.glob("pytorch_model*.bin")):
        raise ModelError(f"{src} has no weights (*.safetensors)", hint="copy the model's weight files too")


def copy_tokenizer(src: Path, out: Path) -> None:
    """tokenizer.json and the small config files beside it, from ``src`` to ``out``."""
    shutil.copy2(src / "tokenizer.json", out / "tokenizer.json")
    for extra in ("tokenizer_config.json", "special_tokens_map.json", "config.json"):
        if (src / extra).is_file():
            shutil.copy2(src / extra, out / extra)


def torch_model(src: Path, auto_class: str = "AutoModel", what: str = "an embedding model") -> Any:
    """``transformers.<auto_class>`` of ``src`` in eval mode; DependencyMissing without torch."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        from ortserve.errors import DependencyMissing

        raise DependencyMissing(f"exporting {what} needs torch and transformers",
                                hint="pip install 'ortserve[convert]'") from exc
    return getattr(transformers, auto_class).from_pretrained(str(src)).eval()


def export_encoder(model: Any, names: list[str], output: str, output_axes: dict[int, str], out: Path) -> None:
    """``model``'s ``output`` field (``last_hidden_state``, ``logits``) -> ``out``/model.onnx,
    the inputs ``names`` (ids, mask[, token types]) with dynamic batch and sequence axes."""
    import warnings

    import torch

    class Body(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, *args: Any) -> Any:
            return getattr(self.m(**dict(zip(names, args, strict=True))), output)

    example = tuple(torch.ones(2, 8, dtype=torch.long) for _ in names)
    axes = {n: {0: "batch", 1: "sequence"} for n in names} | {output: output_axes}
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Body(model), example, str(out / "model.onnx"), input_names=names,
                          output_names=[output], dynamic_axes=axes, opset_version=17, dynamo=False)


def export_onnx(src: Path, out: Path) -> None:
    """The transformer of a sentence-transformers folder -> model.onnx (last hidden state)."""
    import inspect

    model = torch_model(src)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    if "token_type_ids" not in inspect.signature(model.forward).parameters:
        names = names[:2]
    export_encoder(model, names, "last_hidden_state", {0: "batch", 1: "sequence"}, out)


def quantize_int8(fp32: Path, out: Path) -> None:
    """Dynamic int8: per-channel weights on the MatMuls, down-projections and embeddings kept fp32.

    Dynamic quantization scales each MatMul's *input* per tensor. The FFN down-projection
    (weight [intermediate, hidden], e.g. 1536x384) takes the GELU output, whose few large
    values set that scale and crush the rest; keeping those MatMuls (6 of MiniLM's 24) in fp32
    raises the worst cosine vs PyTorch from 0.987 to 0.994 while int8 stays ~1.5x faster than
    fp32 (docs/rag.md). Per-tensor weights were worse still (0.943 worst).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=["MatMul"], nodes_to_exclude=down_projections(onnx.load(str(fp32))))


def down_projections(model: Any) -> list[str]:
    """MatMul nodes whose weight initializer narrows its input (rows > columns): FFN outputs."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and len(n.input) == 2
            and len(shapes.get(n.input[1], ())) == 2 and shapes[n.input[1]][0] > shapes[n.input[1]][1]]


def reference_vectors(src: Path, sentences: list[str], cfg: dict[str, Any]) -> np.ndarray:
    """The PyTorch reference: transformers forward + the same pooling, in fp32."""
    import torch
    from tokenizers import Tokenizer

    from ortserve.engine.embed import pool

    model = torch_model(src)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    rows = []
    with torch.no_grad():
        for s in sentences:
            ids = tok.encode(s).ids[:cfg["max_seq_length"]]
            t = torch.tensor([ids])
            hidden = model(input_ids=t, attention_mask=torch.ones_like(t)).last_hidden_state.numpy()
            rows.append(pool(hidden, np.ones((1, len(ids)), np.int64), cfg["pooling"], cfg["normalize"])[0])
    return np.stack(rows)


def agreement(model_dir: Path, sentences: list[str], ref: np.ndarray) -> dict[str, Any]:
    from ortserve.engine.embed import Embedder

    emb = Embedder(model_dir)
    got = emb.embed_texts(sentences, truncate=True).vectors
    cos = np.sum(_unit(got) * _unit(ref), axis=1)
    return {"cosine_mean": round(float(cos.mean()), 6), "cosine_min": round(float(cos.min()), 6),
            "sentences": len(sentences), "reference": "transformers fp32 on PyTorch, same pooling"}


def sentences_per_second(model_dir: Path, sentences: list[str], reps: int = 3) -> dict[str, Any]:
    from ortserve.engine.embed import Embedder

    emb = Embedder(model_dir)
    emb.embed_texts(sentences[:8], truncate=True)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        emb.embed_texts(sentences, truncate=True)
        best = min(best, time.perf_counter() - t)
    return {"sentences_per_s": round(len(sentences) / best, 1)}


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.clip(np.linalg.norm(v, axis=1, keepdims=True), 1e-12, None)


def write_config(out: Path, src: Path, cfg: dict[str, Any]) -> None:
    """The tokenizer files and embed_config.json (pooling, normalisation, max length) beside a graph."""
    copy_tokenizer(src, out)
    (out / "embed_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
