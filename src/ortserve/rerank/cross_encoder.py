"""The cross-encoder runner: (query, document) pairs through an exported sequence classifier.

A store variant of kind ``reranker`` holds ``model.onnx`` (inputs ``input_ids``,
``attention_mask``, optionally ``token_type_ids``; output ``logits`` of shape (batch, 1)),
``tokenizer.json`` and ``rerank_config.json`` (``max_length``, ``activation``). Pairs are
tokenized as the Hugging Face tokenizer pairs them (``[CLS] query [SEP] doc [SEP]`` with segment
ids 0/1 for BERT; the tokenizer's own post-processor decides), truncated longest-first to
``max_length``, and run in length-sorted batches (engine/embed.py's plan). The score is the
logit through the activation sentence-transformers' ``CrossEncoder`` applies (Sigmoid for a
one-label model unless the model's config names another), so scores equal its ``predict``.
No torch here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.engine.embed import cpu_session, pad_id, plan_batches, session_bytes
from ortserve.errors import InvalidRequest, ModelError

RERANK_CONFIG = "rerank_config.json"
ACTIVATIONS = ("sigmoid", "identity")
# padded tokens per session run (length-sorted pairs fill each run): CPU seconds for 100 pairs
# of ~72 tokens on 2 threads were flat from 256 to 2048 (2.0-2.2 s) and 9% more at 8192
TOKEN_BUDGET = 512


@dataclass(frozen=True)
class RerankConfig:
    max_length: int
    activation: str = "sigmoid"

    @classmethod
    def read(cls, model_dir: Path) -> RerankConfig:
        path = model_dir / RERANK_CONFIG
        if not path.is_file():
            raise ModelError(f"{model_dir} has no {RERANK_CONFIG}; it is not an ortserve reranker",
                             hint="import it with `ortserve models import PATH`")
        d = json.loads(path.read_text(encoding="utf-8"))
        act = str(d.get("activation", "sigmoid"))
        if act not in ACTIVATIONS:
            raise ModelError(f"{path}: activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
        return cls(max_length=int(d["max_length"]), activation=act)


@dataclass
class Scores:
    scores: np.ndarray       # (n,) float32, one per document
    token_counts: list[int]  # tokens of each (query, document) pair, special tokens included

    @property
    def prompt_tokens(self) -> int:
        return sum(self.token_counts)


class CrossEncoder:
    """Thread-safe: the onnxruntime session runs concurrently, tokenizers are per thread."""

    def __init__(self, model_dir: Path, *, threads: int = 0) -> None:
        self.model_dir = Path(model_dir)
        self.config = RerankConfig.read(self.model_dir)
        self.session = cpu_session(self.model_dir, threads)
        self.input_names = {i.name for i in self.session.get_inputs()}
        self._tokenizer_json = (self.model_dir / "tokenizer.json").read_text(encoding="utf-8")
        self._local = threading.local()
        self.pad_id = pad_id(self._tokenizer(0))

    def _tokenizer(self, max_length: int) -> Any:
        """This thread's tokenizer, truncating pairs longest-first to ``max_length`` (0: never)."""
        cache = getattr(self._local, "toks", None)
        if cache is None:
            cache = self._local.toks = {}
        tok = cache.get(max_length)
        if tok is None:
            tok = cache[max_length] = pair_tokenizer(self._tokenizer_json, max_length)
        return tok

    def memory_bytes(self) -> int:
        return session_bytes(self.model_dir)

    def encode(self, query: str, documents: Sequence[str], max_length: int | None = None) -> list[Any]:
        """Each (query, document) pair's encoding, within ``max_length`` tokens (the model's at most)."""
        limit = min(max_length or self.config.max_length, self.config.max_length)
        return self._tokenizer(limit).encode_batch([(query, d) for d in documents], add_special_tokens=True)

    def clip(self, text: str, limit: int) -> str:
        """``text`` cut after its first ``limit`` tokens (Cohere's ``max_tokens_per_doc``)."""
        enc = self._tokenizer(0).encode(text, add_special_tokens=False)
        return text if len(enc.ids) <= limit else text[:enc.offsets[limit - 1][1]]

    def score(self, query: str, documents: Sequence[str], *, max_length: int | None = None,
              max_doc_tokens: int | None = None) -> Scores:
        if not documents:
            raise InvalidRequest("'documents' must not be empty", param="documents")
        if max_doc_tokens:
            documents = [self.clip(d, max_doc_tokens) for d in documents]
        encs = self.encode(query, documents, max_length)
        out = np.empty(len(encs), dtype=np.float32)
        for idx in plan_batches([len(e.ids) for e in encs], budget=TOKEN_BUDGET):
            out[idx] = self._run([encs[i] for i in idx])
        return Scores(out, [len(e.ids) for e in encs])

    def _run(self, batch: list[Any]) -> np.ndarray:
        width = max(len(e.ids) for e in batch)
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        types = np.zeros((len(batch), width), dtype=np.int64)
        for r, e in enumerate(batch):
            n = len(e.ids)
            ids[r, :n], mask[r, :n], types[r, :n] = e.ids, 1, e.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = types
        logits = np.asarray(self.session.run(None, feeds)[0], dtype=np.float32).reshape(len(batch), -1)[:, 0]
        return activate(logits, self.config.activation)


def pair_tokenizer(tokenizer_json: str, max_length: int) -> Any:
    """A ``tokenizers`` tokenizer that encodes (query, document) pairs as the Hugging Face
    tokenizer pairs them, truncated longest-first (the longer side loses tokens first) to ``max_length``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    tok.no_padding()
    if max_length:
        tok.enable_truncation(max_length, strategy="longest_first")
    else:
        tok.no_truncation()
    return tok


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    if activation == "sigmoid":
        return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
    return logits.astype(np.float32)
