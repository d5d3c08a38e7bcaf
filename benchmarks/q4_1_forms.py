"""Which MatMulNBits form of a Q4_1 linear is fast, and which is exact (prints JSON).

    .venv/bin/python benchmarks/q4_1_forms.py [--k 576] [--n 1536] [--layers 30] [--reps 5] [--threads 2]

One Q4_1-like linear (random 4-bit codes, fp16 block minimums) written four ways, ``--layers``
of them in a row per graph, each at accuracy_level 0 (fp32 compute) and 4 (int8 activations):

- ``term``: MatMulNBits + block sums of x @ offsets + Add (what models/gguf/exact.py ships);
- ``float_zp``: MatMulNBits with float zero points ``-m/d`` (exact, one node);
- ``uint8_zp``: MatMulNBits with integer zero points (fast path; Q4_1 minimums are not integer
  multiples of the scale, so not exact: timing only);
- ``none``: no zero point, no minimum (the kernel alone, the floor).

Reported: microseconds per linear (min / median over reps) and, for the exact forms, the
max relative error of the output against float64 math on the same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def build(form: str, acc: int, k: int, n: int, layers: int, w: dict[str, np.ndarray], threads: int) -> ort.InferenceSession:
    g = 32
    inits = [numpy_helper.from_array(w["packed"], "B"), numpy_helper.from_array(w["scales"], "S")]
    extra: list[str] = []
    if form == "float_zp":
        inits.append(numpy_helper.from_array((-w["mins"] / w["scales"]).astype(np.float32), "Z"))
        extra = ["Z"]
    elif form == "uint8_zp":
        inits.append(numpy_helper.from_array(np.full((n, (k // g + 1) // 2), 0x88, np.uint8), "Z"))
        extra = ["Z"]
    elif form == "term":
        ind = np.zeros((k, k // g), np.float32)
        ind[np.arange(k), np.arange(k) // g] = 1
        inits += [numpy_helper.from_array(ind, "I"), numpy_helper.from_array(np.ascontiguousarray(w["mins"].T), "O")]
    nodes, outs = [], []
    for i in range(layers):
        y = f"y{i}"
        q = y + "q" if form == "term" else y
        nodes.append(helper.make_node("MatMulNBits", ["x", "B", "S", *extra], [q], domain="com.microsoft",
                                      K=k, N=n, bits=4, block_size=g, accuracy_level=acc))
        if form == "term":
            nodes += [helper.make_node("MatMul", ["x", "I"], [y + "s"]), helper.make_node("MatMul", [y + "s", "O"], [y + "m"]),
                      helper.make_node("Add", [q, y + "m"], [y])]
        outs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=576)
    ap.add_argument("--n", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    k, n, g = args.k, args.n, 32
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
    w = {"packed": (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(n, k // g, g // 2),
         "scales": rng.random((n, k // g)).astype(np.float32) * 0.01 + 0.001,
         "mins": (rng.standard_normal((n, k // g)) * 0.05).astype(np.float16).astype(np.float32)}
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    # w = d * q + m, with MatMulNBits' implicit zero point 8 in the term form: d * (q - 8) + (m + 8d)
    dense = (codes.reshape(n, k // g, g) * w["scales"][..., None] + w["mins"][..., None]).reshape(n, k)
    want = x.reshape(1, k).astype(np.float64) @ dense.T.astype(np.float64)
    w_term = dict(w, mins=(w["mins"] + 8 * w["scales"]).astype(np.float32))
    sessions = {}
    errors: dict[str, float | None] = {}
    for form in ("term", "float_zp", "uint8_zp", "none"):
        for acc in (0, 4):
            key = f"{form}/acc{acc}"
            s = build(form, acc, k, n, args.layers, w_term if form == "term" else w, args.threads)
            sessions[key] = s
            y = s.run(["y0"], {"x": x})[0].reshape(1, n)
            errors[key] = (float(np.abs(y - want).max() / np.abs(want).max())
                           if form in ("term", "float_zp") else None)
    times: dict[str, list[float]] = {key: [] for key in sessions}
    for _ in range(args.reps):
        for key, s in sessions.items():
            t = time.perf_counter()
            for _ in range(10):
                s.run(None, {"x": x})
            times[key].append((time.perf_counter() - t) / 10 / args.layers * 1e6)
    print(json.dumps({"benchmark": "q4_1_forms", "k": k, "n": n, "threads": args.threads,
                      "loadavg": os.getloadavg(),
                      "forms": {key: {"us_per_linear_min": round(min(v), 1),
                                      "us_per_linear_median": round(float(np.median(v)), 1),
                                      "max_rel_error": errors[key]} for key, v in times.items()}}, indent=2))


if __name__ == "__main__":
    main()
