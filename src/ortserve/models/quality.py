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


def _log_softmax_pick(logits: np.ndarray, targets: np.ndarray, rows: int = 32) -> np.ndarray:
    """log softmax(logits)[targets] per position, in float64, ``rows`` positions at a time: a
    whole 512-token window of a 128k vocabulary is 0.5 GB per float64 temporary (issue 31)."""
    out = np.empty(len(targets), np.float64)
    for a in range(0, len(targets), rows):
        x = logits[a:a + rows].astype(np.float64)
        m = x.max(-1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(x - m).sum(-1))
        out[a:a + rows] = x[np.arange(len(x)), targets[a:a + rows]] - lse
    return out


def token_logprobs(model_dir: Path, ids: list[int], window: int = 512) -> np.ndarray:
    """Log-probability of ids[1:] given their prefixes, window by window (no state across windows)."""
    import onnxruntime as ort

    cfg = json.loads((Path(model_dir) / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    onnx_path = Path(model_dir) / cfg.get("filename", "model.onnx")
    if not onnx_path.is_file():
        raise ModelError(f"{model_dir} has no {onnx_path.name}")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.enable_cpu_mem_arena = False   # a window's activations go back to the system, not to an arena
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    kv_names = [i.name for i in sess.get_inputs() if i.name.startswith("past_key_values")]
    kv_type = next(i.type for i in sess.get_inputs() if i.name.startswith("past_key_values"))
    dtype = np.float16 if "float16" in kv_type else np.float32
    kvh, hd = cfg["num_key_value_heads"], cfg["head_size"]
    out: list[np.ndarray] = []
    feeds: dict[str, Any] = {}
    logits = np.empty(0, np.float32)
    for start in range(0, len(ids) - 1, window):
        chunk = np.array([ids[start:start + window + 1]], dtype=np.int64)
        x = chunk[:, :-1]
        feeds = {"input_ids": x, "attention_mask": np.ones_like(x)}
        for n in kv_names:
            feeds[n] = np.zeros((1, kvh, 0, hd), dtype=dtype)
        logits = sess.run(["logits"], feeds)[0][0]
        if logits.shape[0] != x.shape[1]:
            raise ModelError("perplexity needs per-position logits; this model prunes its LM head")
        out.append(_log_softmax_pick(logits, chunk[0, 1:]))
    del sess, feeds, logits   # the session and the last window's buffers, before the trim
    release_freed_memory()
    return np.concatenate(out)


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
