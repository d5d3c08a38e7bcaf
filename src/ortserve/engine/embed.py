"""The embedding runner: one onnxruntime session, `tokenizers` tokenization, batching, pooling.

A model directory (a store variant of kind ``embedding``) holds ``model.onnx`` (inputs
``input_ids``, ``attention_mask``, optionally ``token_type_ids``; output the last hidden
state), ``tokenizer.json`` and ``embed_config.json`` (pooling, normalisation, dimensions,
max_seq_length). No torch and no sentence-transformers: what sentence-transformers does
after the transformer (mean pooling over the attention mask, L2 normalisation) is a few lines
of numpy here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ContextLengthExceeded, InvalidRequest, ModelError

EMBED_CONFIG = "embed_config.json"
# A session run holds at most this many padded tokens (and at most MAX_BATCH inputs): inputs
# sorted by length fill batches greedily, so short ones go many at a time, long ones a few.
# Measured on MiniLM (docs/rag.md): a fixed 32 per run costs ~30% more CPU than a 256-512 token
# budget, from padding (a long input pads 31 short ones) and from activations outgrowing the cache.
TOKEN_BUDGET = 384
MAX_BATCH = 64
# Dynamic quantization scales each MatMul's input by the min and max of the whole tensor, i.e.
# over every row and pad position of the session run: a text's vector would depend on its batch
# mates. Graphs with these ops run one input per session run (docs/robustness.md).
BATCH_DEPENDENT_OPS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul"})


@dataclass(frozen=True)
class EmbedConfig:
    dimensions: int
    max_seq_length: int
    pooling: str = "mean"       # mean | cls
    normalize: bool = True

    @classmethod
    def read(cls, model_dir: Path) -> EmbedConfig:
        path = model_dir / EMBED_CONFIG
        if not path.is_file():
            raise ModelError(f"{model_dir} has no {EMBED_CONFIG}; it is not an ortserve embedding model",
                             hint="import it with `ortserve models import PATH`")
        d = json.loads(path.read_text(encoding="utf-8"))
        return cls(dimensions=int(d["dimensions"]), max_seq_length=int(d["max_seq_length"]),
                   pooling=str(d.get("pooling", "mean")), normalize=bool(d.get("normalize", True)))


@dataclass
class Embeddings:
    vectors: np.ndarray          # (n, dimensions) float32
    token_counts: list[int]      # tokens per input, special tokens included

    @property
    def prompt_tokens(self) -> int:
        return sum(self.token_counts)


class Embedder:
    """Thread-safe: onnxruntime sessions may run concurrently; tokenizers are per call."""

    def __init__(self, model_dir: Path, *, threads: int = 0) -> None:
        self.model_dir = Path(model_dir)
        self.config = EmbedConfig.read(self.model_dir)
        self.session = cpu_session(self.model_dir, threads)
        self.input_names = {i.name for i in self.session.get_inputs()}
        # one input per run where the graph quantizes activations per tensor (batch invariance)
        self.per_row = quantizes_per_batch(self.model_dir / "model.onnx")
        self._tokenizer_json = (self.model_dir / "tokenizer.json").read_text(encoding="utf-8")
        self._local = threading.local()
        prefix, suffix, pad = _specials(self.tokenizer)
        self.prefix, self.suffix, self.pad_id = prefix, suffix, pad

    @property
    def tokenizer(self) -> Any:
        tok = getattr(self._local, "tok", None)
        if tok is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(self._tokenizer_json)
            tok.no_truncation()
            tok.no_padding()
            self._local.tok = tok
        return tok

    @property
    def dimensions(self) -> int:
        return self.config.dimensions

    @property
    def max_tokens(self) -> int:
        return self.config.max_seq_length

    def memory_bytes(self) -> int:
        return session_bytes(self.model_dir)

    # ---- tokenization ----------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=True)]

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def wrap(self, ids: Sequence[int]) -> list[int]:
        """Token ids given by a client (no special tokens) framed the way the tokenizer frames text."""
        return [*self.prefix, *ids, *self.suffix]

    def fit(self, seqs: list[list[int]], truncate: bool, param: str = "input") -> list[list[int]]:
        """Each sequence within max_seq_length: cut (keeping the closing special tokens) or refuse."""
        limit, out = self.max_tokens, []
        for i, s in enumerate(seqs):
            if len(s) > limit:
                if not truncate:
                    raise ContextLengthExceeded(
                        f"input {i} has {len(s)} tokens; this embedding model takes at most {limit}. "
                        "Shorten it, or send \"truncate\": true to embed its first tokens", param=param)
                s = s[:limit - len(self.suffix)] + list(self.suffix)
            out.append(s)
        return out

    # ---- embedding -------------------------------------------------------------
    def embed_texts(self, texts: Sequence[str], *, truncate: bool = False) -> Embeddings:
        return self.embed_ids(self.fit(self.tokenize(texts), truncate))

    def embed_ids(self, seqs: list[list[int]]) -> Embeddings:
        """Embed tokenized sequences (special tokens included), batched by length."""
        if not seqs:
            raise InvalidRequest("'input' must not be empty", param="input")
        out = np.empty((len(seqs), self.dimensions), dtype=np.float32)
        for idx in plan_batches([len(s) for s in seqs], cap=1 if self.per_row else 0):
            out[idx] = self._run([seqs[i] for i in idx])
        return Embeddings(out, [len(s) for s in seqs])

    def _run(self, batch: list[list[int]]) -> np.ndarray:
        width = max(len(s) for s in batch)
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for r, s in enumerate(batch):
            ids[r, :len(s)] = s
            mask[r, :len(s)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self.session.run(None, feeds)[0]
        return pool(hidden, mask, self.config.pooling, self.config.normalize)


def cpu_session(model_dir: Path, threads: int = 0) -> Any:
    """An onnxruntime CPU session of ``model_dir``/model.onnx (an encoder: embedder or
    cross-encoder): full graph optimisation, ``threads`` intra-op threads (0: onnxruntime's
    choice), and no spinning, so idle threads leave the cores to the chat engines."""
    import onnxruntime as ort

    onnx_path = model_dir / "model.onnx"
    if not onnx_path.is_file():
        raise ModelError(f"{model_dir} has no model.onnx")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])


def session_bytes(model_dir: Path) -> int:
    """Estimate: the weights plus onnxruntime's copy of them while the session lives."""
    return int((model_dir / "model.onnx").stat().st_size * 1.3)


def pad_id(tok: Any) -> int:
    """The tokenizer's padding id: ``[PAD]`` (BERT) or ``<pad>``, else 0."""
    for name in ("[PAD]", "<pad>"):
        pid = tok.token_to_id(name)
        if pid is not None:
            return int(pid)
    return 0


def quantizes_per_batch(onnx_path: Path) -> bool:
    """Whether the graph quantizes activations dynamically (one scale per tensor, so per batch)."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    return any(n.op_type in BATCH_DEPENDENT_OPS for n in graph.node)


def plan_batches(lengths: Sequence[int], budget: int = 0, cap: int = 0) -> list[list[int]]:
    """Input indices grouped into session runs: sorted by length, each run's padded size
    (count x its longest) within ``budget`` tokens and ``cap`` inputs; one input always fits."""
    budget, cap = budget or TOKEN_BUDGET, cap or MAX_BATCH
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and ((len(cur) + 1) * lengths[i] > budget or len(cur) >= cap):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str, normalize: bool) -> np.ndarray:
    """sentence-transformers' Pooling + Normalize: mean over real tokens (or the CLS token)."""
    if mode == "cls":
        v = hidden[:, 0, :]
    else:
        m = mask[:, :, None].astype(np.float32)
        v = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    v = v.astype(np.float32)
    if normalize:
        v /= np.clip(np.linalg.norm(v, axis=1, keepdims=True), 1e-12, None)
    return v


def _specials(tok: Any) -> tuple[list[int], list[int], int]:
    """The special tokens the tokenizer puts before and after a text, and its padding id."""
    enc = tok.encode("a", add_special_tokens=True)
    ids, special = list(enc.ids), list(enc.special_tokens_mask)
    first = special.index(0) if 0 in special else len(ids)
    last = len(special) - special[::-1].index(0) if 0 in special else len(ids)
    return ids[:first], ids[last:], pad_id(tok)
