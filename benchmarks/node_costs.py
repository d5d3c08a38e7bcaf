"""What one node costs a decode step outside the model (prints JSON; docs/native.md, Session 47).

    .venv/bin/python benchmarks/node_costs.py [--threads 2] [--spin] [--total-mb 100] [--k 2048]
                                              [--n 512 2048 8192 32768] [--chain 64] [--reps 30]
                                              [--positions 16 80 144] [--flush-mb 64]

Three measurements, each in real InferenceSessions with the library's ops:

- ``matmul``: GgufMatMul at one activation row (Q4_K, K x N weights, random blocks), as many
  independent nodes as make ``--total-mb`` of weights (more than the last-level cache, so each
  call reads memory), for each N. A line fitted through (bytes, time) per node gives the fixed cost
  of a node (``fixed_us``: quantizing X, the pool's dispatch, the first misses) and the bandwidth
  past it (``gb_per_s``).
- ``chain``: ``--chain`` nodes in a row on one [1, 1, 2048] row against one node, for an Add,
  the library's SkipRmsNorm and onnxruntime's SkipSimplifiedLayerNormalization: the difference
  over ``chain - 1`` is what one more node costs when its inputs are in cache.

- ``cold``: one run of a one-node session warm (run after run) and right after ``--flush-mb`` of
  memory was read (as a decode step's weights pass through the caches between two such nodes):
  an Add (the run's own cost: the binding, the executor, Python), SkipRmsNorm, and onnxruntime's
  GroupQueryAttention at one decode row of the Llama-3.2-1B shape (32 heads, 8 KV heads, 64 wide,
  rotary, the cache bound in place) at each of ``--positions``.

The model's own profile (ONNX Runtime's, benchmarks/op_profile.py) puts the same norm at ~11 us a
node and the attention at ~60 us a layer: what ``cold`` shows is that most of it is the caches the
weights' stream emptied, not the op's arithmetic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import onnxruntime as ort
from _common import machine
from native_ops import gguf_rows, opsets
from onnx import TensorProto, helper, numpy_helper

from ortserve import native

Q4_K = 12
H = 2048


def session(model: Any, threads: int, spin: bool) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    lib = native.status().library
    if lib is None:
        raise SystemExit("the native library is not built: python -m ortserve.native.build")
    so.register_custom_ops_library(str(lib))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def timed(s: ort.InferenceSession, feeds: dict[str, np.ndarray], reps: int) -> float:
    """Median seconds of one run, after three unmeasured."""
    for _ in range(3):
        s.run(None, feeds)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        s.run(None, feeds)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmuls(k: int, n: int, total: int) -> tuple[Any, int]:
    """Independent GgufMatMul nodes on one X, ``total`` bytes of weights in all (at least one)."""
    count = max(1, total // (n * native.row_bytes(Q4_K, k)))
    rng = np.random.default_rng(0)
    nodes, inits, outs = [], [], []
    for i in range(count):
        inits.append(numpy_helper.from_array(gguf_rows(Q4_K, n, k, rng), f"w{i}"))
        nodes.append(helper.make_node(native.MATMUL_OP, ["X", f"w{i}"], [f"y{i}"], domain=native.DOMAIN,
                                      ggml_type=Q4_K, K=k, N=n))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "matmuls", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, k])],
                              outs, inits)
    return helper.make_model(graph, opset_imports=opsets()), count


def chain(op: str, length: int) -> Any:
    """``length`` nodes of ``op`` in a row, each on the last one's output."""
    nodes, prev = [], "X"
    for i in range(length):
        if op == "SkipRmsNorm":
            nodes.append(helper.make_node(op, [prev, "S", "g"], [f"o{i}", f"s{i}"], domain=native.DOMAIN, epsilon=1e-5))
        elif op == "SkipSimplifiedLayerNormalization":
            nodes.append(helper.make_node(op, [prev, "S", "g"], [f"o{i}", "", "", f"s{i}"], domain="com.microsoft",
                                          epsilon=1e-5))
        else:
            nodes.append(helper.make_node("Add", [prev, "S"], [f"o{i}"]))
        prev = f"o{i}"
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 1, H]) for name in ("X", "S")]
    graph = helper.make_graph(nodes, "chain", inputs, [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones(H, np.float32), "g")])
    return helper.make_model(graph, opset_imports=opsets())


def one_node(op: str, t: int = 0) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A one-node model, its inputs and the arrays its outputs are bound to (GQA: the KV cache in place)."""
    rng = np.random.default_rng(3)
    row = rng.standard_normal((1, 1, H)).astype(np.float32)
    if op == "Add":
        node = helper.make_node("Add", ["X", "S"], ["O"])
        return (graph_of([node], {"X": row, "S": row}, ["O"]), {"X": row, "S": row}, {"O": np.zeros_like(row)})
    if op == "SkipRmsNorm":
        node = helper.make_node(op, ["X", "S", "g"], ["O", "T"], domain=native.DOMAIN, epsilon=1e-5)
        feeds = {"X": row, "S": row, "g": np.ones(H, np.float32)}
        return graph_of([node], feeds, ["O", "T"]), feeds, {"O": np.zeros_like(row), "T": np.zeros_like(row)}
    heads, kv, d, cap = 32, 8, 64, 512
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin"],
                            ["O", "pk_out", "pv_out"], domain="com.microsoft", num_heads=heads, kv_num_heads=kv,
                            do_rotary=1)
    cache = [rng.standard_normal((1, kv, cap, d)).astype(np.float32) for _ in range(2)]
    feeds = {"q": rng.standard_normal((1, 1, heads * d)).astype(np.float32),
             "k": rng.standard_normal((1, 1, kv * d)).astype(np.float32),
             "v": rng.standard_normal((1, 1, kv * d)).astype(np.float32), "pk": cache[0], "pv": cache[1],
             "seqlens": np.array([t - 1], np.int32), "total": np.array(t, np.int32),
             "cos": rng.standard_normal((4096, d // 2)).astype(np.float32),
             "sin": rng.standard_normal((4096, d // 2)).astype(np.float32)}
    outs = {"O": np.zeros((1, 1, heads * d), np.float32), "pk_out": cache[0], "pv_out": cache[1]}
    return graph_of([node], feeds, list(outs)), feeds, outs


def graph_of(nodes: list[Any], feeds: dict[str, np.ndarray], outputs: list[str]) -> Any:
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}
    inputs = [helper.make_tensor_value_info(n, types[a.dtype], list(a.shape)) for n, a in feeds.items()]
    graph = helper.make_graph(nodes, "one", inputs, [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                                     for n in outputs])
    return helper.make_model(graph, opset_imports=opsets())


def warm_and_cold(s: ort.InferenceSession, feeds: dict[str, np.ndarray], outs: dict[str, np.ndarray],
                  flush: np.ndarray, reps: int) -> dict[str, float]:
    """Median microseconds of one bound run, run after run and right after reading ``flush``."""
    io = s.io_binding()
    for name, arr in feeds.items():
        io.bind_cpu_input(name, arr)
    for name, arr in outs.items():
        io.bind_output(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
    for _ in range(5):
        s.run_with_iobinding(io)
    warm, cold = [], []
    for _ in range(reps):
        t = time.perf_counter()
        s.run_with_iobinding(io)
        warm.append(time.perf_counter() - t)
    for _ in range(reps):
        flush.sum()
        t = time.perf_counter()
        s.run_with_iobinding(io)
        cold.append(time.perf_counter() - t)
    return {"warm_us": round(statistics.median(warm) * 1e6, 1), "cold_us": round(statistics.median(cold) * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spin", action="store_true", help="the pool's threads spin (the benchmarks' --spin on)")
    ap.add_argument("--total-mb", type=float, default=100.0)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, nargs="+", default=[512, 2048, 8192, 32768])
    ap.add_argument("--chain", type=int, default=64)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--positions", type=int, nargs="+", default=[16, 80, 144])
    ap.add_argument("--flush-mb", type=float, default=64.0)
    args = ap.parse_args()
    if args.chain < 2 or args.k % 256 or any(n < 1 for n in args.n) or not all(0 < t <= 512 for t in args.positions):
        raise SystemExit("--chain must be at least 2, --k a multiple of 256, every --n positive, "
                         "every --positions in 1..512")
    x = np.random.default_rng(1).standard_normal((1, 1, args.k)).astype(np.float32)
    rows = []
    for n in args.n:
        model, count = matmuls(args.k, n, int(args.total_mb * 2**20))
        seconds = timed(session(model, args.threads, args.spin), {"X": x}, args.reps)
        node_bytes = n * native.row_bytes(Q4_K, args.k)
        rows.append({"n": n, "nodes": count, "node_mb": round(node_bytes / 1e6, 3),
                     "us_per_node": round(seconds / count * 1e6, 2),
                     "gb_per_s": round(count * node_bytes / seconds / 1e9, 2)})
    fit: dict[str, float] = {}
    if len({r["n"] for r in rows}) > 1:
        slope, fixed = np.polyfit([r["node_mb"] for r in rows], [r["us_per_node"] for r in rows], 1)
        fit = {"fixed_us": round(float(fixed), 2), "gb_per_s": round(1e3 / float(slope), 2)}
    row = np.random.default_rng(2).standard_normal((1, 1, H)).astype(np.float32)
    chains = {}
    for op in ("Add", "SkipRmsNorm", "SkipSimplifiedLayerNormalization"):
        one = timed(session(chain(op, 1), args.threads, args.spin), {"X": row, "S": row}, args.reps)
        many = timed(session(chain(op, args.chain), args.threads, args.spin), {"X": row, "S": row}, args.reps)
        chains[op] = {"us_one_node_run": round(one * 1e6, 2),
                      "us_per_added_node": round((many - one) / (args.chain - 1) * 1e6, 2)}
    flush = np.ones(int(args.flush_mb * 2**18), np.float32)
    cold: dict[str, Any] = {}
    for op, t in [("Add", 0), ("SkipRmsNorm", 0)] + [("GroupQueryAttention", t) for t in args.positions]:
        model, feeds, outs = one_node(op, t)
        cold[f"{op}@{t}" if t else op] = warm_and_cold(session(model, args.threads, args.spin), feeds, outs, flush,
                                                       args.reps)
    print(json.dumps({"benchmark": "node_costs", "machine": machine(), "threads": args.threads, "spin": args.spin,
                      "isa": native.status().isa, "matmul": {"type": "Q4_K", "k": args.k, "rows": rows, "fit": fit},
                      "chain": {"length": args.chain, "row": H, "ops": chains},
                      "cold": {"flush_mb": args.flush_mb, "runs": cold}}, indent=2))


if __name__ == "__main__":
    main()
