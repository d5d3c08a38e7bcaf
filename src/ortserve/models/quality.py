"""Quality: perplexity of an ONNX GenAI model on the project's fixed held-out text.

Runs the decoder graph directly with onnxruntime (CPU) in windows of up to
``window`` tokens, so it works for any precision the builder produces and never
needs PyTorch. Models whose LM head was pruned to the last position are scored
token by token.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError


def heldout_text() -> str:
    return resources.files("ortserve").joinpath("data/heldout.txt").read_text(encoding="utf-8")


class LogSoftmaxPick:
    """log softmax(logits)[target] per position, in float64, fed the vocabulary in column pieces
    (a layered gate's LM head) or whole, ``rows`` positions at a time: a whole 512-token window
    of a 128k vocabulary is 0.5 GB per float64 temporary (issue 31). Whole, it is the one-pass
    max / sum of exp; in pieces, the running max rescales the sum (within 1e-12)."""

    def __init__(self, targets: np.ndarray, rows: int = 32) -> None:
        self.targets, self.rows = np.asarray(targets), rows
        self.max = np.full(len(self.targets), -np.inf)
        self.sum = np.zeros(len(self.targets))
        self.picked = np.full(len(self.targets), np.nan)

    def add(self, first: int, logits: np.ndarray) -> None:
        """Columns first..first+width of the logits, one row per target."""
        if logits.shape[0] != len(self.targets):
            raise ModelError("perplexity needs per-position logits; this model prunes its LM head")
        width = logits.shape[-1]
        for a in range(0, len(self.targets), self.rows):
            x = logits[a:a + self.rows].astype(np.float64)
            m = np.maximum(self.max[a:a + self.rows], x.max(-1))
            self.sum[a:a + self.rows] = (self.sum[a:a + self.rows] * np.exp(self.max[a:a + self.rows] - m)
                                         + np.exp(x - m[:, None]).sum(-1))
            self.max[a:a + self.rows] = m
            t = self.targets[a:a + self.rows] - first
            inside = (t >= 0) & (t < width)
            self.picked[a:a + self.rows][inside] = x[np.flatnonzero(inside), t[inside]]

    def result(self) -> np.ndarray:
        if np.isnan(self.picked).any():
            raise ModelError("the logits did not cover every target token")
        return self.picked - (self.max + np.log(self.sum))


def _log_softmax_pick(logits: np.ndarray, targets: np.ndarray, rows: int = 32) -> np.ndarray:
    """log softmax(logits)[targets] per position, in float64, ``rows`` positions at a time."""
    pick = LogSoftmaxPick(targets, rows)
    pick.add(0, logits)
    return pick.result()


def token_logprobs(model_dir: Path, ids: list[int], window: int = 512, budget: int | None = None) -> np.ndarray:
    """Log-probability of ids[1:] given their prefixes, window by window (no state across windows).
    A graph with more than ``budget`` bytes of weights (0: never) runs a few layers at a time, so
    the gate never holds the whole model (models/gate_segments.py)."""
    import onnx
    import onnxruntime as ort

    from ortserve.engine.runtime import register_custom_ops
    from ortserve.models.gate_segments import BUDGET, run_layered

    cfg = json.loads((Path(model_dir) / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    onnx_path = Path(model_dir) / cfg.get("filename", "model.onnx")
    if not onnx_path.is_file():
        raise ModelError(f"{model_dir} has no {onnx_path.name}")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.enable_cpu_mem_arena = False   # a window's activations go back to the system, not to an arena
    register_custom_ops(so, Path(model_dir))   # a GGUF-native graph's kernels (models/gguf/native.py)

    def session(path: Path) -> Any:
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    model = onnx.load(str(onnx_path), load_external_data=False)
    empty = {i.name: np.zeros((1, cfg["num_key_value_heads"], 0, cfg["head_size"]),
                              np.float16 if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else np.float32)
             for i in model.graph.input if i.name.startswith("past_key_values")}
    chunks = [np.array([ids[s:s + window + 1]], dtype=np.int64) for s in range(0, len(ids) - 1, window)]
    windows = [{"input_ids": c[:, :-1], "attention_mask": np.ones_like(c[:, :-1]), **empty} for c in chunks]
    picks = [LogSoftmaxPick(c[0, 1:]) for c in chunks]

    def score(w: int, first: int, logits: np.ndarray) -> None:
        picks[w].add(first, logits[0])

    budget = BUDGET if budget is None else budget
    try:
        layered = bool(budget) and run_layered(onnx_path, model, windows, score, session, budget,
                                               release_freed_memory)
    except OSError:   # its runs are written beside the model: a read-only (--link) directory
        layered = False
        picks = [LogSoftmaxPick(c[0, 1:]) for c in chunks]
    if not layered:
        del model
        sess = session(onnx_path)
        for w, feeds in enumerate(windows):
            score(w, 0, sess.run(["logits"], feeds)[0])
        del sess   # the session and the last window's buffers, before the trim
    release_freed_memory()
    return np.concatenate([p.result() for p in picks])


def release_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``): onnxruntime's and
    numpy's freed buffers otherwise stay in this process, so each later step of an import (the
    reference perplexity, the shipped one, the speed run) started ~0.5 GB higher (issue 31)."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):   # not glibc (musl): nothing to trim
            pass


def perplexity(model_dir: Path, text: str | None = None, window: int = 512) -> dict[str, Any]:
    """Perplexity on ``text`` (default: the shipped held-out set), with the token count."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    ids = tok.encode(text if text is not None else heldout_text()).ids
    if len(ids) < 2:
        raise ModelError("perplexity needs at least two tokens of text")
    lp = token_logprobs(model_dir, ids, window)
    return {"perplexity": float(np.exp(-lp.mean())), "tokens": len(lp)}
