"""Cross-encoder rerankers into the store: Hugging Face / sentence-transformers directories of a
sequence classifier with one label (bge-reranker, ms-marco-MiniLM-L6: ``*ForSequenceClassification``).

The classifier is exported once to ONNX with torch (the ``convert`` extra; serving reads none of
this code: rerank/cross_encoder.py runs the file) and installed as ``fp32-cpu`` with
``kind: "reranker"``, its ``rerank_config.json`` (max_length, activation) and its quality: the
largest difference between its scores and the PyTorch reference's (transformers forward + the
same activation) on pairs of the held-out sentences.
"""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError
from ortserve.models.embed_export import check_source, copy_tokenizer, export_encoder, torch_model
from ortserve.models.store import ModelStore, Variant, validate_name
from ortserve.rerank.cross_encoder import RERANK_CONFIG, CrossEncoder, activate, pair_tokenizer

# sentence-transformers' activation names (config.json) -> ours
ACTIVATION_NAMES = {"torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.Sigmoid": "sigmoid",
                    "torch.nn.modules.linear.Identity": "identity", "torch.nn.Identity": "identity"}
# the reference's tolerance at import: an fp32 export that differs more is refused
MAX_DIFF = 1e-3


def _config(path: Path) -> dict[str, Any]:
    cfg = path / "config.json"
    if not cfg.is_file():
        return {}
    try:
        return dict(json.loads(cfg.read_text(encoding="utf-8")))
    except ValueError:
        return {}


def is_cross_encoder_dir(path: Path) -> bool:
    archs = _config(path).get("architectures") or [""]
    return str(archs[0]).endswith("ForSequenceClassification")


def rerank_config(path: Path) -> dict[str, Any]:
    """max_length and activation as sentence-transformers' CrossEncoder reads them."""
    cfg = _config(path)
    labels = int(cfg.get("num_labels") or len(cfg.get("id2label") or {}) or 1)
    if labels != 1:
        raise ModelError(f"{path.name} is a classifier with {labels} labels; a reranker has one (a relevance score)")
    name = (cfg.get("sentence_transformers") or {}).get("activation_fn") or cfg.get(
        "sbert_ce_default_activation_function") or "torch.nn.modules.activation.Sigmoid"
    if name not in ACTIVATION_NAMES:
        raise ModelError(f"{path.name}: activation {name!r} is not supported",
                         hint="rerankers with Sigmoid or Identity on their one logit are")
    positions = int(cfg.get("max_position_embeddings") or 512)
    if cfg.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        positions -= 2   # their position ids start after the padding index
    max_len = positions
    tok_cfg = path / "tokenizer_config.json"
    if tok_cfg.is_file():
        m = json.loads(tok_cfg.read_text(encoding="utf-8")).get("model_max_length")
        if isinstance(m, int | float) and 0 < m < 1e6:
            max_len = min(max_len, int(m))
    sb = path / "sentence_bert_config.json"
    if sb.is_file() and json.loads(sb.read_text(encoding="utf-8")).get("max_seq_length"):
        max_len = int(json.loads(sb.read_text(encoding="utf-8"))["max_seq_length"])
    return {"max_length": max_len, "activation": ACTIVATION_NAMES[name]}


def _torch_classifier(src: Path) -> Any:
    return torch_model(src, "AutoModelForSequenceClassification", "a reranker")


def export_onnx(src: Path, out: Path) -> None:
    """The classifier -> model.onnx (input_ids, attention_mask[, token_type_ids] -> logits)."""
    model = _torch_classifier(src)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    if "token_type_ids" not in inspect.signature(model.forward).parameters or model.config.type_vocab_size in (0, None):
        names = names[:2]
    export_encoder(model, names, "logits", {0: "batch"}, out)


def heldout_pairs() -> tuple[list[str], list[str]]:
    """Queries and documents from the held-out sentences: each query against every document."""
    from ortserve.models.embed_import import heldout_sentences

    s = heldout_sentences()
    return s[:4], s[4:20]


def reference_scores(src: Path, model: Any, query: str, documents: list[str], cfg: dict[str, Any]) -> np.ndarray:
    """transformers fp32 forward on the same pair encodings, through the same activation."""
    import torch

    tok = pair_tokenizer((src / "tokenizer.json").read_text(encoding="utf-8"), cfg["max_length"])
    types = "token_type_ids" in inspect.signature(model.forward).parameters
    out = []
    with torch.no_grad():
        for e in tok.encode_batch([(query, d) for d in documents]):   # the pairs exactly as served
            feeds = {"input_ids": torch.tensor([e.ids]), "attention_mask": torch.ones(1, len(e.ids), dtype=torch.long)}
            if types:
                feeds["token_type_ids"] = torch.tensor([e.type_ids])
            out.append(float(model(**feeds).logits[0, 0]))
    return activate(np.array(out, dtype=np.float32), cfg["activation"])


def agreement(model_dir: Path, src: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    ce = CrossEncoder(model_dir)
    queries, docs = heldout_pairs()
    import torch

    model = _torch_classifier(src)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # 64 small forwards: OpenMP's spinning threads cost 30x on a busy machine
    try:
        diffs = [np.abs(ce.score(q, docs).scores - reference_scores(src, model, q, docs, cfg)).max() for q in queries]
    finally:
        torch.set_num_threads(threads)
    return {"max_abs_diff": float(max(diffs)), "pairs": len(queries) * len(docs),
            "reference": "transformers fp32 on PyTorch, same activation"}


def pairs_per_second(model_dir: Path, reps: int = 3) -> dict[str, Any]:
    ce = CrossEncoder(model_dir)
    queries, docs = heldout_pairs()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        ce.score(queries[0], docs)
        best = min(best, time.perf_counter() - t)
    return {"pairs_per_s": round(len(docs) / best, 1)}


def import_cross_encoder(store: ModelStore, src: Path, model_id: str, *, progress: Any = None,
                         replace: bool = False) -> Variant:
    validate_name(model_id)
    src = Path(src).resolve()
    check_source(src)
    cfg = rerank_config(src)
    say = progress or (lambda _m: None)

    def build(tmp: Path) -> dict[str, Any]:
        say(f"exporting {src.name} to ONNX")
        export_onnx(src, tmp)
        copy_tokenizer(src, tmp)
        (tmp / RERANK_CONFIG).write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        say("comparing scores with PyTorch and measuring pairs/s")
        quality = agreement(tmp, src, cfg)
        if quality["max_abs_diff"] > MAX_DIFF:
            raise ModelError(f"{src.name}: the ONNX export's scores differ from PyTorch's by "
                             f"{quality['max_abs_diff']:.2g} (more than {MAX_DIFF})")
        archs = _config(src).get("architectures") or [""]
        return {"kind": "reranker", "device": "cpu", "precision": "fp32", "architecture": str(archs[0]),
                "context_length": cfg["max_length"], "source": f"hf:{src}", "notes": {"reranker": cfg},
                "quality": quality, "speed": pairs_per_second(tmp)}

    return store.install(model_id, "fp32-cpu", build, replace=replace)
