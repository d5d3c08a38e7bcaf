"""Where the streamed GGUF graph's +0.19% perplexity on the default model comes from; prints JSON.

    .venv/bin/python benchmarks/rope_ulp.py

The default model's GGUF is imported twice into a temporary store: through the builder's graph
(files under gguf_fast.STREAM_MIN_BYTES) and through the graph written from its metadata (the
streamed path). The two graphs have the same nodes and the same quantized blocks; only their
rotary cos/sin caches differ (torch's float32 pow and cos against numpy's, by an ulp here and
there). Then the streamed graph is measured with its own caches, with the builder's caches, and
with caches from other, equally valid roundings of the rotary frequencies (a few of them moved by
one ulp; four seeds), each with the MatMulNBits as shipped (accuracy_level 4: int8 activations)
and at accuracy_level 0 (fp32 activations).
docs/gguf.md, "Streamed import", cites the result.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, machine

from ortserve.models.catalog import embedded_gguf
from ortserve.models.gguf import fast as gguf_fast
from ortserve.models.gguf_check import with_accuracy_level
from ortserve.models.importer import import_gguf
from ortserve.models.quality import perplexity
from ortserve.models.store import ModelStore

CACHES = ("cos_cache", "sin_cache")


def caches(model_dir: Path) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor

    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    out = {}
    for t in model.graph.initializer:
        if t.name in CACHES:
            load_external_data_for_tensor(t, str(model_dir))
            out[t.name] = numpy_helper.to_array(t)
    return out


def rope_theta() -> float:
    from gguf import GGUFReader

    from ortserve.models.gguf.reader import _field

    return float(_field(GGUFReader(str(embedded_gguf())), "llama.rope.freq_base", 10000.0))


def with_caches(src: Path, dst: Path, arrays: dict[str, np.ndarray]) -> Path:
    """A copy of ``src`` whose cos/sin caches are ``arrays`` (written inline in the graph)."""
    import onnx
    from onnx import numpy_helper

    shutil.copytree(src, dst)
    model = onnx.load(str(dst / "model.onnx"), load_external_data=False)
    for t in model.graph.initializer:
        if t.name in arrays:
            t.CopyFrom(numpy_helper.from_array(arrays[t.name], t.name))
    onnx.save_model(model, str(dst / "model.onnx"))
    return dst


def ppl(model_dir: Path, tmp: Path) -> dict[str, float]:
    level0 = with_accuracy_level(model_dir, 0, out_dir=Path(tempfile.mkdtemp(dir=tmp))).parent
    return {"accuracy_level_4": round(perplexity(model_dir)["perplexity"], 4),
            "accuracy_level_0": round(perplexity(level0)["perplexity"], 4)}


def main() -> None:
    result: dict[str, Any] = {"machine": machine()}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        builder = import_gguf(ModelStore(tmp / "builder"), embedded_gguf(), "smol").model_dir
        gguf_fast.STREAM_MIN_BYTES = 0
        streamed = import_gguf(ModelStore(tmp / "streamed"), embedded_gguf(), "smol").model_dir
        cb, cs = caches(builder), caches(streamed)
        result["caches"] = {k: {"entries_differing": int(np.sum(cb[k] != cs[k])), "entries": int(cb[k].size),
                                "max_abs_diff": float(np.abs(cb[k] - cs[k]).max())} for k in CACHES}
        result["builder_graph"] = ppl(builder, tmp)
        result["streamed_graph"] = ppl(streamed, tmp)
        result["streamed_graph_with_builder_caches"] = ppl(with_caches(streamed, tmp / "swap", cb), tmp)
        # other roundings of the same frequencies: theta ** (i/d) moved by one ulp in a few of
        # the 32 entries (as numpy's pow differs from torch's), the angles computed as the streamed
        # path does; the angle at position p then moves by about p * 1e-7
        theta, half = rope_theta(), cs["cos_cache"].shape[1]
        exps = np.arange(0, 2 * half, 2, dtype=np.int64).astype(np.float32) / np.float32(2 * half)
        inv = np.float32(1.0) / np.power(np.float64(theta), exps.astype(np.float64)).astype(np.float32)
        pos = np.arange(cs["cos_cache"].shape[0], dtype=np.float32)
        for seed in range(4):
            rng = np.random.default_rng(seed)
            moved = np.where(rng.random(half) < 0.2, np.nextafter(inv, np.where(rng.random(half) < 0.5, np.float32(0), np.float32(2))),
                             inv).astype(np.float32)
            freqs = np.outer(pos, moved)
            arrays = {"cos_cache": np.cos(freqs).astype(np.float32), "sin_cache": np.sin(freqs).astype(np.float32)}
            result[f"streamed_graph_frequencies_moved_1ulp_seed{seed}"] = {
                "frequencies_moved": int(np.sum(moved != inv)),
                **ppl(with_caches(streamed, tmp / f"s{seed}", arrays), tmp)}
    emit(result)


if __name__ == "__main__":
    main()
