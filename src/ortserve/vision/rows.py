"""Qwen2.5-VL rows for the batched engine (engine/embeds_runner.py; docs/vision.md "Batched rows").

A request's prompt becomes token ids where each image token is a *virtual id*:
``BASE + serial * STRIDE + k``, ``serial`` the image's number here (one per sha256 of its bytes,
never reused while this feed lives) and ``k`` the token's place in the image. The engine's prefix
cache compares ids, so it keys on the image as well as the text.

This feed answers the runner's three questions:

* ``embed``: the embedding graph (input ids + image features -> inputs_embeds), with each virtual
  id fed as ``<|image_pad|>`` and the image's feature row ``k`` spliced there by the graph.
* ``positions``: Qwen's 3-row mRoPE, as transformers' ``get_rope_index`` computes it for images:
  text advances all three rows together; an image's tokens take (t, h, w) grid indices after the
  position it starts at; the text after it continues from the largest position + 1.
* ``offset``: that continuation minus the token count (``rope_deltas``), for decode steps.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BASE = 1 << 40       # virtual ids start here: far above any vocabulary
STRIDE = 1 << 20     # tokens one image may have (1280 at transformers' default max_pixels)


@dataclass
class Image:
    serial: int
    features: np.ndarray            # [tokens, hidden]
    grid: tuple[int, int, int]      # (t, h, w) in merged tokens


class QwenFeed:
    """Virtual image ids, their features, and the embedding graph, for one loaded model."""

    position_rows = 3

    def __init__(self, embedding: Path, image_token_id: int, max_bytes: int = 256 << 20) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(embedding), providers=["CPUExecutionProvider"])
        names = {i.name: i for i in self.session.get_inputs()}
        self.ids_dtype = np.int32 if names["input_ids"].type == "tensor(int32)" else np.int64
        self.hidden = int(names["image_features"].shape[-1])
        self.out = self.session.get_outputs()[0].name
        self.image_token_id = image_token_id
        self.placeholder_id = image_token_id   # what the engine's repetition penalty reads a virtual id as
        self.max_bytes = max_bytes
        self.serials: dict[str, int] = {}                     # sha256 -> serial (kept: ids stay unique)
        self.grids: dict[int, tuple[int, int, int]] = {}      # serial -> grid (kept: positions need it)
        self.images: OrderedDict[int, Image] = OrderedDict()  # serial -> features, least recently used first
        self.bytes = 0
        self._lock = threading.Lock()

    # ---- requests -------------------------------------------------------------------
    def register(self, sha256: str, features: np.ndarray, grid: tuple[int, int, int]) -> list[int]:
        """The virtual ids of one image (its features kept for the rows that will be fed them)."""
        t, h, w = grid
        n = t * h * w
        if features.shape[0] != n or n >= STRIDE:
            raise ValueError(f"an image of grid {grid} has {features.shape[0]} feature rows, not {n}")
        with self._lock:
            serial = self.serials.setdefault(sha256 or f"anon-{len(self.serials)}", len(self.serials))
            self.grids[serial] = grid
            if serial in self.images:
                self.images.move_to_end(serial)
            else:
                self.images[serial] = Image(serial, np.asarray(features, dtype=np.float32), grid)
                self.bytes += features.nbytes
                while self.bytes > self.max_bytes and len(self.images) > 1:
                    _, old = self.images.popitem(last=False)
                    self.bytes -= old.features.nbytes
        return list(range(BASE + serial * STRIDE, BASE + serial * STRIDE + n))

    def expand(self, ids: list[int], images: list[list[int]]) -> list[int]:
        """``ids`` with the i-th ``<|image_pad|>`` replaced by the virtual ids of the i-th image."""
        out: list[int] = []
        it = iter(images)
        for i in ids:
            out.extend(next(it) if i == self.image_token_id else (i,))
        return out

    def _image(self, serial: int) -> Image:
        with self._lock:
            image = self.images.get(serial)
        if image is None:  # only after 256 MB of newer images while this one waited or was preempted
            raise RuntimeError("this request's image features are no longer held (more newer images than "
                               "the feature budget keeps); send the request again")
        return image

    # ---- the runner's questions -------------------------------------------------------
    def embed(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        virtual = ids >= BASE
        feats = np.zeros((0, self.hidden), dtype=np.float32)
        if virtual.any():
            v = ids[virtual] - BASE
            serials, ks = v // STRIDE, v % STRIDE
            feats = np.concatenate([self._image(int(s)).features[k:k + 1] for s, k in zip(serials, ks, strict=True)])
        feed = np.where(virtual, self.image_token_id, ids).astype(self.ids_dtype)[None]
        out = self.session.run([self.out], {"input_ids": feed, "image_features": feats})[0]
        return np.asarray(out[0], dtype=np.float32)

    def _walk(self, held: np.ndarray) -> tuple[np.ndarray, int]:
        """Positions [3, n] of all of ``held``, and the offset the text after it continues from."""
        n = len(held)
        pos = np.empty((3, n), dtype=np.int64)
        virtual = held >= BASE
        starts = np.flatnonzero(virtual & ((held - BASE) % STRIDE == 0))
        delta, prev = 0, 0
        for s in starts:
            pos[:, prev:s] = np.arange(prev, s) + delta
            t, h, w = self.grids[int(held[s] - BASE) // STRIDE]
            size = t * h * w
            end = min(s + size, n)
            p0 = s + delta
            grid = np.indices((t, h, w)).reshape(3, size)[:, :end - s]
            pos[:, s:end] = p0 + grid
            delta = p0 + max(t, h, w) - (s + size)
            prev = s + size
        if prev < n:
            pos[:, prev:] = np.arange(prev, n) + delta
        return pos, delta

    def positions(self, held: np.ndarray, start: int) -> np.ndarray:
        return self._walk(held)[0][:, start:]

    def offset(self, held: np.ndarray) -> int:
        if not (held >= BASE).any():
            return 0
        return self._walk(held)[1]
