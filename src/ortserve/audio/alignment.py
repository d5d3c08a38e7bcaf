"""Word timestamps from Whisper's cross-attention (the method of openai-whisper's timing.py).

A few decoder heads ("alignment heads", listed by the model's own config) attend to the audio
frames where each token is spoken. og runs the decoder without exposing attention, so this module
runs a second ONNX Runtime session on the same ``decoder.onnx`` (same weights, read in place) whose
cross-attention nodes also return their ``qk`` output (ONNX Runtime's MultiHeadAttention scores).
After a window is decoded, its text tokens go through that session once, against the encoder's
cross-attention keys and values that og already computed for the window (``present_key_cross_*``).
The heads' attention, normalized per frame and median-filtered, is averaged into a token x frame
cost matrix; dynamic time warping finds the monotonic path through it, and each word starts at the
frame where the path reaches its first token (50 frames per second, as Whisper's encoder).
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.native import register_custom_ops

FRAMES_PER_SECOND = 50           # encoder positions per second (1500 per 30 s window)
MEDIAN_WIDTH = 7                 # frames: the median filter over each head's attention
PREPEND = "\"'“¿([{-"            # punctuation that belongs to the word after it
APPEND = "\"'.。,，!！?？:：”)]}、"   # punctuation that belongs to the word before it
NO_SPACE_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}   # split into characters, not at spaces


@dataclass
class Word:
    word: str
    start: float
    end: float
    tokens: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"word": self.word, "start": round(self.start, 2), "end": round(self.end, 2)}


def default_heads(layers: int, heads: int) -> list[tuple[int, int]]:
    """Without the model's list: every head of the decoder's second half (openai-whisper's default)."""
    return [(layer, h) for layer in range(layers // 2, layers) for h in range(heads)]


def attention_decoder(model_dir: Path, layers: set[int], threads: int = 0) -> Any:
    """An onnxruntime session of ``decoder.onnx`` whose cross-attention in ``layers`` also outputs
    its scores as ``cross_qk_<layer>`` (the weights stay in the model's own external data file)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_dir / "decoder.onnx"), load_external_data=False)
    found = set()
    for node in model.graph.node:
        if node.op_type != "MultiHeadAttention" or len(node.input) < 2 or \
                not node.input[1].startswith("past_key_cross_"):
            continue
        layer = int(node.input[1].rsplit("_", 1)[1])
        if layer not in layers:
            continue
        outs = list(node.output) + [""] * (3 - len(node.output))
        del node.output[:]
        node.output.extend(outs[:3] + [f"cross_qk_{layer}"])
        model.graph.output.append(onnx.helper.make_tensor_value_info(f"cross_qk_{layer}", onnx.TensorProto.FLOAT,
                                                                     None))
        found.add(layer)
    if found != layers:
        raise ValueError(f"decoder.onnx has no cross-attention node for layers {sorted(layers - found)}")
    opts = register_custom_ops(ort.SessionOptions(), model_dir)   # the LM head's native kernels (whisper/graph.py)
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(model_dir))
    if threads > 0:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


class Aligner:
    """Token and word times of a decoded window, from the alignment heads' cross-attention."""

    def __init__(self, model_dir: Path, heads: list[tuple[int, int]], layers: int, kv_heads: int,
                 head_size: int, threads: int = 0) -> None:
        self.heads = heads
        self.layers = layers
        self.shape = (1, kv_heads, 0, head_size)
        self.session = attention_decoder(model_dir, {layer for layer, _ in heads}, threads)
        self.input_types = {i.name: i.type for i in self.session.get_inputs()}

    def attention(self, tokens: list[int], cross: dict[str, np.ndarray]) -> np.ndarray:
        """Scores (heads, len(tokens), 1500) of every alignment head, ``tokens`` fed at once."""
        dtype = np.int64 if self.input_types["input_ids"] == "tensor(int64)" else np.int32
        feed: dict[str, np.ndarray] = {"input_ids": np.array([tokens], dtype=dtype)}
        for i in range(self.layers):
            feed[f"past_key_self_{i}"] = np.zeros(self.shape, np.float32)
            feed[f"past_value_self_{i}"] = np.zeros(self.shape, np.float32)
            feed[f"past_key_cross_{i}"] = cross[f"present_key_cross_{i}"]
            feed[f"past_value_cross_{i}"] = cross[f"present_value_cross_{i}"]
        layers = sorted({layer for layer, _ in self.heads})
        qk = dict(zip(layers, self.session.run([f"cross_qk_{layer}" for layer in layers], feed), strict=True))
        return np.stack([qk[layer][0, h] for layer, h in self.heads])

    def token_starts(self, sot: list[int], text: list[int], eot: int, cross: dict[str, np.ndarray],
                     frames: int) -> np.ndarray:
        """Seconds (from the window's start) at which each of ``text`` and the final end-of-text begin."""
        scores = self.attention([*sot, *text, eot], cross)[:, :, :max(1, frames)].astype(np.float64)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        mean, std = weights.mean(axis=-2, keepdims=True), weights.std(axis=-2, keepdims=True)
        weights = median_filter((weights - mean) / np.maximum(std, 1e-9), MEDIAN_WIDTH)
        matrix = weights.mean(axis=0)[len(sot) - 1:-1]      # rows: the step that predicts each text token, then eot
        rows, cols = dtw(-matrix)
        first = np.concatenate([[True], np.diff(rows) > 0])
        return cols[first] / FRAMES_PER_SECOND


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over ``width`` frames along the last axis (edges reflected), as openai-whisper's."""
    if x.shape[-1] <= width // 2:
        return x
    from scipy.ndimage import median_filter as scipy_median

    # scipy's "mirror" edges are numpy's "reflect" (d c b | a b c d), as openai-whisper pads; a median picks
    # one of the values, so this equals np.median over the padded windows exactly, at a quarter of the CPU
    # (24 heads x 80 tokens x 1500 frames: 0.18 s vs 0.78 s; it was 15% of a transcription with words)
    return scipy_median(x, size=(1,) * (x.ndim - 1) + (width,), mode="mirror")


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path from (0, 0) to the last cell (steps right, down or diagonal):
    (row, column) of each step. Filled one anti-diagonal at a time, so it is numpy, not a double loop."""
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    move = np.zeros((n + 1, m + 1), np.int8)          # 0 diagonal, 1 from above, 2 from the left
    for d in range(2, n + m + 1):
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        options = np.stack([acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]])
        best = options.argmin(axis=0)
        acc[i, j] = cost[i - 1, j - 1] + options[best, np.arange(len(i))]
        move[i, j] = best
    i, j, path = n, m, []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        step = move[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    out = np.array(path)
    return out[:, 0], out[:, 1]


def split_words(tokens: list[int], decode: Callable[[list[int]], str], language: str) -> list[tuple[str, list[int]]]:
    """Words (text, tokens): a new word at a leading space or punctuation (characters for languages
    written without spaces); tokens that end mid-character join the next until the text is whole."""
    pieces: list[tuple[str, list[int]]] = []
    run: list[int] = []
    for t in tokens:
        run.append(t)
        text = decode(run)
        if "\ufffd" not in text:
            pieces.append((text, run))
            run = []
    if run:
        pieces.append((decode(run), run))
    if language in NO_SPACE_LANGUAGES:
        return pieces
    words: list[tuple[str, list[int]]] = []
    for text, toks in pieces:
        if not words or text.startswith(" ") or text.strip() in string.punctuation:
            words.append((text, list(toks)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + toks)
    return words


def merge_punctuation(words: list[tuple[str, list[int]]]) -> list[tuple[str, list[int]]]:
    """Opening marks join the word after them, closing marks the word before (text and tokens)."""
    out: list[tuple[str, list[int]]] = []
    carry: tuple[str, list[int]] | None = None
    for text, toks in words:
        bare = text.strip()
        if carry is not None:
            text, toks = carry[0] + text.lstrip(), carry[1] + toks
            carry = None
        elif bare and all(c in APPEND for c in bare) and out:
            out[-1] = (out[-1][0] + bare, out[-1][1] + toks)
            continue
        if bare and all(c in PREPEND for c in bare):
            carry = (text, toks)
            continue
        out.append((text, toks))
    if carry is not None:
        out.append(carry)
    return out


def words_of(tokens: list[int], starts: np.ndarray, decode: Callable[[list[int]], str], language: str,
             offset: float) -> list[Word]:
    """Timed words of ``tokens`` (text only): each from its first token's start to the next word's
    (the last to the end-of-text's), ``starts`` being ``Aligner.token_starts``."""
    out, at = [], 0
    for text, toks in merge_punctuation(split_words(tokens, decode, language)):
        nxt = at + len(toks)
        out.append(Word(text.strip(), offset + float(starts[at]), offset + float(starts[nxt]), toks))
        at = nxt
    return out


SENTENCE_END = ".。!！?？"


def tidy(words: list[Word], start: float, end: float) -> list[Word]:
    """Whisper's corrections for a segment's words: the warping path lingers on the last token before
    a pause, so a word ending (or following) a sentence is cut to twice the median word length
    (at most 1.4 s, as openai-whisper); then every word is held inside the segment's own timestamps
    where that leaves it a length."""
    lengths = [w.end - w.start for w in words if w.end > w.start]
    longest = 2 * min(0.7, float(np.median(lengths))) if lengths else 0.0
    for i, w in enumerate(words):
        if longest and w.end - w.start > longest:
            if w.word[-1:] in SENTENCE_END:
                w.end = w.start + longest
            elif i > 0 and words[i - 1].word[-1:] in SENTENCE_END or i == 0:
                w.start = w.end - longest
        lo, hi = max(w.start, start), min(w.end, end)
        if hi > lo:
            w.start, w.end = lo, hi
    return words
