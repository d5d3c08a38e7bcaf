"""GgufMatMul (the ortserve.gguf custom op on the file's own blocks) against MatMulNBits (ONNX Runtime's
4-bit op, the layout the exact GGUF import used before), one K x N weight, in real InferenceSessions.

Both weights are graph initializers (MatMulNBits prepacks its own; GgufMatMul reads the GGUF rows as
they are). MatMulNBits gets 4 bits, blocks of 32, a uint8 zero point per block (Q4_K has a minimum
per sub-block) and accuracy_level 4 (int8 activations), as gguf_graph.py writes it. Prints JSON:
median milliseconds per call at each M, and the weight bytes each op reads.

    .venv/bin/python benchmarks/native_ops.py --k 2048 --n 2048 --threads 2 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ortserve import native
from ortserve.native import build

F16_FIELDS = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def gguf_rows(t: int, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    be, bb = native.BLOCK_ELEMS[t], native.BLOCK_BYTES[t]
    w = rng.integers(0, 256, size=(n, k // be, bb), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        w[..., off:off + 2] = rng.uniform(0.002, 0.05, size=(n, k // be)).astype(np.float16)[..., None].view(np.uint8)
    return w.reshape(n, -1)


def opsets() -> list:
    return [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
            helper.make_opsetid(native.DOMAIN, native.OPSET)]


def gguf_model(t: int, k: int, n: int, rng: np.random.Generator) -> tuple[bytes, int]:
    w = gguf_rows(t, n, k, rng)
    node = helper.make_node(native.MATMUL_OP, ["X", "W"], ["Y"], domain=native.DOMAIN, ggml_type=t, K=k, N=n)
    graph = helper.make_graph([node], "gguf", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n])],
                              initializer=[numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=opsets()).SerializeToString(), w.nbytes


def nbits_model(k: int, n: int, rng: np.random.Generator, block: int = 32) -> tuple[bytes, int]:
    blocks = k // block
    codes = rng.integers(0, 256, size=(n, blocks, block // 2), dtype=np.uint8)
    scales = rng.uniform(0.002, 0.05, size=(n * blocks,)).astype(np.float32)
    zeros = rng.integers(0, 256, size=(n * ((blocks + 1) // 2),), dtype=np.uint8)
    node = helper.make_node("MatMulNBits", ["X", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=k, N=n,
                            bits=4, block_size=block, accuracy_level=4)
    inits = [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "S"),
             numpy_helper.from_array(zeros, "Z")]
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n])], initializer=inits)
    return helper.make_model(graph, opset_imports=opsets()).SerializeToString(), codes.nbytes + scales.nbytes + zeros.nbytes


def timed(sess: ort.InferenceSession, x: np.ndarray, reps: int) -> float:
    for _ in range(3):
        sess.run(None, {"X": x})
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sess.run(None, {"X": x})
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def direct_ms(t: int, k: int, n: int, m: int, reps: int, rng: np.random.Generator) -> float:
    """The kernels called straight through ctypes, one thread: what the op's glue adds is the rest."""
    lib = ctypes.CDLL(str(native.library_path()))
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    lib.osg_act_row_bytes.restype = ctypes.c_size_t
    lib.osg_act_row_bytes.argtypes = [ctypes.c_int, i64]
    lib.osg_quantize_act.argtypes = [ctypes.c_int, vp, vp, i64]
    lib.osg_matmul_rows.argtypes = [ctypes.c_int, i64, vp, vp, i64, vp, i64, i64, i64]
    w, x = gguf_rows(t, n, k, rng), rng.standard_normal((m, k)).astype(np.float32)
    ab = lib.osg_act_row_bytes(t, k)
    xq, y = np.zeros(m * ab, np.uint8), np.zeros((m, n), np.float32)
    times = []
    for _ in range(reps + 3):
        t0 = time.perf_counter()
        for r in range(m):
            lib.osg_quantize_act(t, x[r].ctypes.data, xq[r * ab:].ctypes.data, k)
        lib.osg_matmul_rows(t, k, w.ctypes.data, xq.ctypes.data, m, y.ctypes.data, n, 0, n)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--types", nargs="+", default=["Q4_K"], choices=sorted(native.TYPE_IDS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    built = build.build()
    st = native.status()
    if not st.active:
        raise SystemExit(f"the native ops are off: {st.reason} ({built.reason})")
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.register_custom_ops_library(str(st.library))
    rng = np.random.default_rng(0)
    models = {"MatMulNBits(4 bit, block 32, zero points)": nbits_model(args.k, args.n, rng)}
    for name in args.types:
        models[f"GgufMatMul({name})"] = gguf_model(native.TYPE_IDS[name], args.k, args.n, rng)
    rows = []
    for label, (graph, nbytes) in models.items():
        sess = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])
        for m in args.m:
            x = rng.standard_normal((m, args.k)).astype(np.float32)
            ms = timed(sess, x, args.reps if m <= 8 else max(5, args.reps // 5))
            rows.append({"op": label, "m": m, "ms": round(ms, 3), "weight_mb": round(nbytes / 2**20, 2),
                         "weight_gb_per_s": round(nbytes / ms / 1e6, 1)})
    for name in args.types:
        for m in args.m:
            reps = args.reps if m <= 8 else max(5, args.reps // 5)
            rows.append({"op": f"kernel {name}, direct, 1 thread", "m": m,
                         "ms": round(direct_ms(native.TYPE_IDS[name], args.k, args.n, m, reps, rng), 3)})
    out = {"k": args.k, "n": args.n, "threads": args.threads, "isa": st.isa, "cpu": platform.processor(),
           "onnxruntime": ort.__version__, "results": rows}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
