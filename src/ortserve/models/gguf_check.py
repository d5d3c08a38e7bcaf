"""The exactness check of a GGUF import: logits of a short random input through the patched
graph (at fp32 compute and as shipped) against the fp32 reference build of the same weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np


def with_accuracy_level(model_dir: Path, level: int, name: str = "model.gguf-check.onnx",
                        out_dir: Path | None = None, split_rows: int = 0) -> Path:
    """A copy of the graph whose MatMulNBits compute at ``level``: beside the original as ``name``
    (sharing the weights file), or, with ``out_dir``, a whole model directory there (the graph under
    its own name, every other file copied) that loads like the original. ``split_rows``: see
    ``split_wide``."""
    import onnx

    cfg = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    filename = cfg.get("filename", "model.onnx")
    model = onnx.load(str(model_dir / filename), load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = level
    if split_rows:
        split_wide(model, split_rows)
    if out_dir is None:
        out = model_dir / name
    else:
        for f in model_dir.iterdir():
            if f.is_file() and f.name != filename:
                shutil.copy(f, out_dir / f.name)
        out = out_dir / filename
    onnx.save_model(model, str(out))
    return out


def split_wide(model: Any, rows: int) -> None:
    """Each MatMulNBits wider than ``rows`` outputs becomes several of at most ``rows`` whose
    outputs are concatenated: the same sums for every output, but a kernel that dequantizes its
    whole matrix per run (8-bit at fp32 compute: 1 GB for a 128k x 2048 LM head, issue 31) holds
    one slice at a time. The slices point into the same external data (rows are contiguous)."""
    from onnx import helper

    inits = {t.name: t for t in model.graph.initializer}
    nodes: list[Any] = []
    for node in model.graph.node:
        attrs = {a.name: a.i for a in node.attribute}
        ext = [inits.get(n) for n in node.input[1:3]]
        if (node.op_type != "MatMulNBits" or attrs["N"] <= rows or len(node.input) > 3
                or any(t is None or not t.external_data for t in ext)):
            nodes.append(node)
            continue
        parts = []
        for a in range(0, attrs["N"], rows):
            n = min(rows, attrs["N"] - a)
            names = [_row_slice(model, t, a, n) for t in ext]
            out = f"{node.output[0]}/rows{a}"
            nodes.append(helper.make_node("MatMulNBits", [node.input[0], *names], [out], name=f"{node.name}/rows{a}",
                                          domain="com.microsoft", **{**attrs, "N": n}))
            parts.append(out)
        nodes.append(helper.make_node("Concat", parts, [node.output[0]], name=f"{node.name}/concat", axis=-1))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _row_slice(model: Any, t: Any, start: int, n: int) -> str:
    """A new initializer: rows start..start+n of external tensor ``t`` (row-major, same file)."""
    from onnx import TensorProto

    ext = {e.key: e.value for e in t.external_data}
    row = int(ext["length"]) // t.dims[0]
    s = TensorProto()
    s.name, s.data_type, s.data_location = f"{t.name}/rows{start}", t.data_type, TensorProto.EXTERNAL
    s.dims.extend([n, *t.dims[1:]])
    for k, v in (("location", ext["location"]), ("offset", str(int(ext.get("offset", 0)) + start * row)),
                 ("length", str(n * row))):
        e = s.external_data.add()
        e.key, e.value = k, v
    model.graph.initializer.append(s)
    return s.name


def logits(onnx_path: Path, ids: np.ndarray, kv_heads: int, head_size: int) -> np.ndarray:
    import onnxruntime as ort

    from ortserve.engine.runtime import register_custom_ops

    so = ort.SessionOptions()
    so.log_severity_level = 3
    register_custom_ops(so, Path(onnx_path).parent)   # a GGUF-native graph's kernels (gguf_native)
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            dtype = np.float16 if "float16" in i.type else np.float32
            feeds[i.name] = np.zeros((1, kv_heads, 0, head_size), dtype=dtype)
    return np.asarray(sess.run(["logits"], feeds)[0], dtype=np.float64)


def logit_check(model_dir: Path, ref_dir: Path, n_tokens: int = 16, seed: int = 0) -> dict[str, float]:
    """Relative max logit difference vs the fp32 reference: fp32 compute, and as shipped."""
    cfg = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]
    dec = cfg["decoder"]
    ids = np.random.default_rng(seed).integers(0, cfg["vocab_size"], (1, n_tokens), dtype=np.int64)
    ref_path = ref_dir / json.loads((ref_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]["filename"]
    want = logits(ref_path, ids, dec["num_key_value_heads"], dec["head_size"])
    scale = max(float(np.abs(want).max()), 1e-30)
    check = with_accuracy_level(model_dir, 0)
    try:
        exact = logits(check, ids, dec["num_key_value_heads"], dec["head_size"])
    finally:
        check.unlink(missing_ok=True)
    shipped = logits(model_dir / dec["filename"], ids, dec["num_key_value_heads"], dec["head_size"])
    return {"fp32_compute": float(np.abs(exact - want).max() / scale),
            "shipped": float(np.abs(shipped - want).max() / scale),
            "argmax_agreement": float((shipped.argmax(-1) == want.argmax(-1)).mean())}
