"""Kernel time per decode step by node kind, from ONNX Runtime's own profiler (prints JSON).

    .venv/bin/python benchmarks/op_profile.py [--model ID_OR_DIR] [--steps 64] [--threads 1] [--spin]

Runs the engine's Runner (prefill 40 tokens, then ``--steps`` greedy decode steps) with
``enable_profiling`` and sums the ``*_kernel_time`` events of the decode steps by kind. The
exact GGUF import's extra nodes are split out: ``minimum_term`` (block sums @ offsets),
``minimum_add`` and ``block_sums``; ``lm_head`` is the 8-bit LM head. Shares are of the
summed kernel time, so they hold up better under machine load than absolute times.

The floor: ``weight_bytes_per_token`` sums, by node kind, the initializers each decode step
must read (every weight once; the embedding Gather reads one row), and ``memory_bandwidth``
measures what one thread and ``--threads`` threads can read from RAM (numpy sums of a 512 MB
buffer, best of 5). bandwidth / bytes is the decode speed no kernel can beat on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort
from _common import emit, machine, model_dir

from ortserve.engine.runner import ModelSpec, Runner


def kind(name: str, op: str) -> str:
    if "gguf_blocksum" in name:
        return "block_sums"
    if name.endswith("/gguf_min"):
        return "minimum_term"
    if name.endswith("/gguf_add"):
        return "minimum_add"
    if "lm_head" in name:
        return "lm_head"
    return op


def weight_bytes(onnx_path: Path) -> dict[str, int]:
    """Initializer bytes one decode step reads from RAM, by node kind (see ``kind``).

    Each initializer counts once (a small one several nodes share stays in cache). Lookup
    tables count one row, since a step reads only its token's row: the embedding (``Gather*``
    and the ``Reshape`` ORT folds into it at load) and GroupQueryAttention's cos/sin caches.
    """
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    item = {t.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
            for t in model.graph.initializer}
    out: dict[str, int] = defaultdict(int)
    seen: set[str] = set()
    lookups = ("Gather", "GatherBlockQuantized", "Reshape", "GroupQueryAttention")
    # lookups last: a tied embedding shares its blocks with the LM head, which reads them all
    for node in sorted(model.graph.node, key=lambda nd: nd.op_type in lookups):
        k = kind(node.name, node.op_type)
        for name in node.input:
            if name not in dims or name in seen:
                continue
            seen.add(name)
            n = int(np.prod(dims[name])) if dims[name] else 1
            if node.op_type in lookups:
                out["lookup_rows"] += n * item[name] // max(dims[name][0] if dims[name] else 1, 1)
            else:
                out[k] += n * item[name]
    return dict(out)


def read_bandwidth(threads: int, mb: int = 512, reps: int = 5) -> float:
    """GB/s read from RAM by ``threads`` threads summing disjoint slices of one buffer."""
    from concurrent.futures import ThreadPoolExecutor

    buf = np.ones(mb * 2**20 // 8, dtype=np.int64)
    parts = np.array_split(buf, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(reps):
            t = time.perf_counter()
            list(pool.map(np.sum, parts))   # numpy releases the GIL in the reduction
            best = min(best, time.perf_counter() - t)
    return buf.nbytes / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--spin", action="store_true", help="the pool's threads spin (vs_llamacpp.py's --spin on)")
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = args.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if args.spin else "0")
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ortserve-ops")
    runner = Runner(ModelSpec.read(path), slots=1, session_options=so)
    tok = int(np.argmax(runner.prefill(0, list(range(100, 140)))))
    for _ in range(args.steps):
        tok = int(np.argmax(runner.decode(np.array([tok], dtype=np.int64))[0]))
    trace = Path(runner.session.end_profiling())
    events = json.loads(trace.read_text(encoding="utf-8"))
    trace.unlink()
    runs = [e for e in events if e.get("name") == "model_run"][-args.steps:]
    start = runs[0]["ts"]
    us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") == "Node" and e["ts"] >= start and e["name"].endswith("_kernel_time"):
            k = kind(e["name"].removesuffix("_kernel_time"), e["args"]["op_name"])
            us[k] += e["dur"]
            count[k] += 1
    total = sum(us.values())
    cfg = json.loads((Path(path) / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    wb = weight_bytes(Path(path) / cfg.get("filename", "model.onnx"))
    per_token = sum(wb.values())
    bw = {f"{n}_threads_gb_s": round(read_bandwidth(n), 2) for n in sorted({1, args.threads})}
    best_bw = max(bw.values())
    floor = {"weight_bytes_per_token": per_token,
             "by_kind_mb": {k: round(v / 1e6, 2) for k, v in sorted(wb.items(), key=lambda kv: -kv[1])},
             "memory_bandwidth": bw,
             "bandwidth_bound_tok_s": round(best_bw * 1e9 / per_token, 1),
             "measured_tok_s": round(1e6 / float(np.median([e["dur"] for e in runs])), 1)}
    rows = sorted(us, key=lambda k: -us[k])
    emit({"benchmark": "op_profile", "model": mid, "machine": machine(), "threads": args.threads, "spin": args.spin,
          "steps": args.steps, "model_run_us_median": float(np.median([e["dur"] for e in runs])),
          "kernels": {k: {"us_per_step": round(us[k] / args.steps, 1), "share": round(us[k] / total, 4),
                          "nodes_per_step": count[k] // args.steps} for k in rows},
          "floor": floor, "loadavg_at_end": os.getloadavg()})


if __name__ == "__main__":
    main()
