"""Where a decode step's time goes on a streamed GGUF import (issue 31), printed as JSON.

    PYTHONPATH=src .venv/bin/python benchmarks/decode_profile.py --gguf FILE.gguf --model IMPORTED_DIR
        [--threads 2] [--rounds 3] [--steps 64] [--llama-bin DIR] [--no-speed] [--against OTHER_DIR]

Three parts, all on the same file:

* ``bytes_per_token``: from the ONNX graph, the initializer bytes one decode step reads, node by
  node (MatMulNBits codes + scales, the minimum term's offsets and, in graphs before the
  ReduceSum block sums, the 0/1 indicator it multiplied by; the LM head; the embedding reads
  one row), grouped by the GGUF type of the node's tensors (Q4_K, Q6_K, ...) and by role (attn,
  ffn, lm_head), beside the GGUF file's bytes for the same tensors, which is what llama.cpp
  reads (its blocks as they are). ``mlas_packed_*``: what the kernels read after ONNX Runtime
  prepacks MatMulNBits (one more fp32 per block: see the note in the output).
* ``speed``: decode ms/token of ortserve's Runner (the serving path, greedy, ``--steps``
  tokens after a 16-token prompt) and of ``llama-bench -p 0 -n 128`` (tg128), interleaved for
  ``--rounds`` rounds, each turned into effective GB/s = bytes per token / seconds per token.
* ``profile``: ONNX Runtime's own profiler (``enable_profiling`` on the Runner's session) over
  ``--steps`` decode steps, kernel time summed by kind: MatMulNBits by bits/block and whether
  the node carries a minimum term, the minimum term's own nodes (block sums, offsets MatMul,
  Add), GroupQueryAttention, the LM head, the rest by op type.
* ``a_b`` (with ``--against``): decode ms/token of another import of the same file (an older
  graph form) and of ``--model``, two Runners in one process, alternating round by round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, machine
from op_profile import read_bandwidth

# graph node (the builder's names, gguf_graph.py) -> the GGUF tensors whose rows it holds
PROJ = {"qkv_proj": ("attn_q", "attn_k", "attn_v"), "q_proj": ("attn_q",), "k_proj": ("attn_k",),
        "v_proj": ("attn_v",), "o_proj": ("attn_output",), "gate_up_proj": ("ffn_gate", "ffn_up"),
        "gate_proj": ("ffn_gate",), "up_proj": ("ffn_up",), "down_proj": ("ffn_down",)}


def gguf_tensors(path: Path) -> dict[str, tuple[str, int, int]]:
    """name -> (GGML type, bytes in the file, rows)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, int(t.n_bytes), int(t.shape[1]) if len(t.shape) > 1 else 1)
            for t in r.tensors}


def matrix_of(node_name: str, tied: bool) -> tuple[str, tuple[str, ...]] | None:
    """(role, GGUF tensor names) of a MatMulNBits / dense MatMul node, or None."""
    if node_name.startswith("/lm_head/"):
        return "lm_head", ("token_embd.weight",) if tied else ("output.weight",)
    m = re.match(r"/model/layers\.(\d+)/(attn|mlp)/(\w+)/MatMul", node_name)
    if m is None or m.group(3) not in PROJ:
        return None
    return ("attn" if m.group(2) == "attn" else "ffn"), tuple(f"blk.{m.group(1)}.{t}.weight" for t in PROJ[m.group(3)])


def bytes_per_token(onnx_path: Path, gguf_path: Path) -> dict[str, Any]:
    """Bytes one decode step reads, ortserve's graph against the GGUF's own blocks (llama.cpp)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    size = {t.name: int(np.prod(t.dims, dtype=np.int64)) * np.dtype(
        onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize for t in model.graph.initializer}
    file = gguf_tensors(gguf_path)
    tied = "output.weight" not in file
    by_out = {o: n for n in model.graph.node for o in n.output}
    # a minimum term belongs to the node it is added to: Add(MatMulNBits out, MatMul(blocksum, offsets))
    extra: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    seen: set[str] = set()
    for n in model.graph.node:
        if n.op_type == "MatMul" and n.name.endswith("/gguf_min"):
            owner = n.name.removesuffix("/gguf_min")
            extra[owner]["offsets"] += size.get(n.input[1], 0)
            bs = by_out.get(n.input[0])
            if bs is not None and bs.name not in seen:
                seen.add(bs.name)    # one block-sum node may serve q and k: count it once
                extra[owner]["blocksum_indicator"] += size.get(bs.input[1], 0)
    rows: list[dict[str, Any]] = []
    other = 0
    for n in model.graph.node:
        if n.op_type not in ("MatMulNBits", "MatMul") or "gguf_min" in n.name or "gguf_blocksum" in n.name:
            if n.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "Add", "Mul"):
                other += sum(size.get(i, 0) for i in n.input if i in size)
            continue
        found = matrix_of(n.name, tied)
        if found is None:
            continue
        role, names = found
        owner = n.name.rsplit("/", 1)[0]
        got = {"codes": size.get(n.input[1], 0), "scales": size.get(n.input[2], 0) if len(n.input) > 2 else 0,
               "zero_points": size.get(n.input[3], 0) if len(n.input) > 3 else 0, **extra.get(owner, {})}
        attrs = {a.name: a.i for a in n.attribute}
        total_rows = sum(file[t][2] for t in names)
        for t in names:      # a fused node's bytes split over its tensors by rows
            share = file[t][2] / total_rows
            rows.append({"node": n.name, "tensor": t, "role": role, "gguf_type": file[t][0],
                         "bits": attrs.get("bits", 32), "block": attrs.get("block_size", 0),
                         "gguf_bytes": file[t][1], **{k: round(v * share) for k, v in got.items()}})
    parts = ("codes", "scales", "zero_points", "offsets", "blocksum_indicator")

    def group(key: str) -> dict[str, Any]:
        out: dict[str, dict[str, Any]] = {}
        for r in rows:
            g = out.setdefault(r[key], {"tensors": 0, "gguf_mb": 0.0, **dict.fromkeys(parts, 0.0)})
            g["tensors"] += 1
            g["gguf_mb"] += r["gguf_bytes"] / 1e6
            for p in parts:
                g[p] += r.get(p, 0) / 1e6
        for g in out.values():
            g["ortserve_mb"] = sum(g[p] for p in parts)
            g["ortserve_vs_gguf"] = round(g["ortserve_mb"] / g["gguf_mb"], 3)
            g["mlas_packed_mb"] = g["ortserve_mb"] + g["scales"] - g["blocksum_indicator"]
            for k in ("gguf_mb", "ortserve_mb", "mlas_packed_mb", *parts):
                g[k] = round(g[k], 2)
        return out

    ours = sum(r.get(p, 0) for r in rows for p in parts) + other
    theirs = sum(r["gguf_bytes"] for r in rows) + sum(
        v[1] for k, v in file.items() if k.endswith("norm.weight"))
    packed = ours + sum(r["scales"] - r.get("blocksum_indicator", 0) for r in rows)
    return {"ortserve_bytes": ours, "llama_cpp_bytes": theirs, "ratio": round(ours / theirs, 3),
            "mlas_packed_bytes": packed, "mlas_packed_ratio": round(packed / theirs, 3),
            "gguf_file_bytes": gguf_path.stat().st_size, "norms_and_other_bytes": other,
            "by_gguf_type": group("gguf_type"), "by_role": group("role"),
            "mlas_packed_note": "what the kernels read: MLAS's int8-compute prepacking keeps an fp32 block sum "
                                "(-scale x zero point) beside each fp32 scale, so codes + 2 x scales (+ the minimum "
                                "term's offsets); the session's resident anonymous memory after load agrees",
            "note": "one decode step, short context: KV cache reads, the embedding row and cos/sin rows are "
                    "left out (KB); each block-sum indicator is counted once per node that reads it"}


def kernel_kind(node: Any | None, op: str) -> str:
    """The profile's kind of a node: MatMulNBits split by bits/block and minimum term."""
    if node is None:
        return op
    if "gguf_blocksum" in node.name:
        return "min term: block sums"
    if node.name.endswith("/gguf_min"):
        return "min term: offsets MatMul"
    if node.name.endswith("/gguf_add"):
        return "min term: Add"
    if op == "MatMulNBits":
        a = {x.name: x.i for x in node.attribute}
        head = "lm_head " if node.name.startswith("/lm_head/") else ""
        zp = "uint8/float zero points" if len(node.input) > 3 and node.input[3] else "no zero points"
        return f"{head}MatMulNBits {a['bits']}-bit block {a['block_size']} ({zp})"
    return op


def runner_for(model: Path, threads: int, profile: bool, *, slots: int = 1, last_logits_only: bool = True,
               capacity: int = 256) -> Any:
    """ortserve's Runner (the serving path) on ``model``; ``last_logits_only=False``: the graph as
    exported, logits for every input position (what onnxruntime-genai runs)."""
    from ortserve.config import load_settings
    from ortserve.engine.runner import ModelSpec, Runner
    from ortserve.engine.runtime import session_options

    so = session_options(load_settings())
    so.intra_op_num_threads = threads
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ortserve-decode")
    return Runner(ModelSpec.read(model), slots=slots, capacity=capacity, session_options=so,
                  last_logits_only=last_logits_only)


def decode_ms(runner: Any, steps: int) -> float:
    """Median ms per decode step over ``steps`` greedy steps after a 16-token prompt."""
    tok = int(np.argmax(runner.prefill(0, list(range(1000, 1016)))))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        tok = int(np.argmax(runner.decode(np.array([tok], dtype=np.int64))[0]))
        times.append(time.perf_counter() - t)
    runner.clear(0)
    return float(np.median(times)) * 1e3


def llama_bench(bin_dir: Path, gguf_path: Path, threads: int, prompt: int, gen: int) -> float | None:
    """llama-bench tokens/s of ``-p prompt -n gen`` (one repetition), or None without the binary."""
    exe = bin_dir / "llama-bench"
    if not exe.is_file():
        return None
    out = subprocess.run([str(exe), "-m", str(gguf_path), "-p", str(prompt), "-n", str(gen), "-t", str(threads),
                          "-r", "1", "-o", "json"], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return float(json.loads(out.stdout)[0]["avg_ts"])


def llama_tg128(bin_dir: Path, gguf_path: Path, threads: int) -> float | None:
    """llama-bench tg128 tokens/s (one repetition), or None without the binary."""
    return llama_bench(bin_dir, gguf_path, threads, 0, 128)


def profile(model: Path, threads: int, steps: int) -> dict[str, Any]:
    import onnx

    runner = runner_for(model, threads, profile=True)
    tok = int(np.argmax(runner.prefill(0, list(range(1000, 1016)))))
    for _ in range(steps):
        tok = int(np.argmax(runner.decode(np.array([tok], dtype=np.int64))[0]))
    trace = Path(runner.session.end_profiling())
    events = json.loads(trace.read_text(encoding="utf-8"))
    trace.unlink()
    spec = json.loads((model / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    graph = onnx.load(str(model / spec.get("filename", "model.onnx")), load_external_data=False)
    nodes = {n.name: n for n in graph.graph.node}
    runs = [e for e in events if e.get("name") == "model_run"][-steps:]
    us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") == "Node" and e["ts"] >= runs[0]["ts"] and e["name"].endswith("_kernel_time"):
            k = kernel_kind(nodes.get(e["name"].removesuffix("_kernel_time")), e["args"]["op_name"])
            us[k] += e["dur"]
            count[k] += 1
    total = sum(us.values())
    run_us = float(np.median([e["dur"] for e in runs]))
    return {"steps": steps, "model_run_us_median": run_us, "kernel_us_per_step": round(total / steps, 1),
            "kinds": {k: {"us_per_step": round(us[k] / steps, 1), "share": round(us[k] / total, 4),
                          "nodes_per_step": count[k] // steps} for k in sorted(us, key=lambda k: -us[k])}}


def a_b(a: Path, b: Path, threads: int, rounds: int, steps: int) -> dict[str, Any]:
    """Median decode ms/token of two model directories, two Runners in this process, alternating."""
    ra, rb = runner_for(a, threads, profile=False), runner_for(b, threads, profile=False)
    decode_ms(ra, 8), decode_ms(rb, 8)   # warm-up
    ms: dict[str, list[float]] = {"a": [], "b": []}
    for _ in range(rounds):
        ms["a"].append(decode_ms(ra, steps))
        ms["b"].append(decode_ms(rb, steps))
    med = {k: float(np.median(v)) for k, v in ms.items()}
    return {"a": str(a), "b": str(b), "a_ms": [round(x, 2) for x in ms["a"]], "b_ms": [round(x, 2) for x in ms["b"]],
            "b_speed_vs_a": round(med["a"] / med["b"], 3), "loadavg": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--model", required=True, help="the imported model directory (benchmarks/scale.py's *.onnx)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN",
                                                          str(Path.home() / ".cache/ortserve-test/llama.cpp/build/bin")))
    ap.add_argument("--no-speed", action="store_true", help="bytes and profile only")
    ap.add_argument("--against", default=None, help="another import of the same file (e.g. an older graph): "
                    "its decode ms/token, interleaved round by round with --model's (A/B)")
    args = ap.parse_args()
    gguf_path, model = Path(args.gguf), Path(args.model)
    spec = json.loads((model / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    result: dict[str, Any] = {"benchmark": "decode_profile", "gguf": gguf_path.name, "machine": machine(),
                              "threads": args.threads}
    b = result["bytes_per_token"] = bytes_per_token(model / spec.get("filename", "model.onnx"), gguf_path)
    if not args.no_speed:
        runner = runner_for(model, args.threads, profile=False)
        ours, theirs = [], []
        for _ in range(args.rounds):     # interleaved: the machine is shared, its load drifts
            ours.append(decode_ms(runner, args.steps))
            tps = llama_tg128(Path(args.llama_bin), gguf_path, args.threads)
            if tps:
                theirs.append(1e3 / tps)
        del runner
        o, t = float(np.median(ours)), float(np.median(theirs)) if theirs else None
        result["speed"] = {
            "ortserve_ms_per_token": [round(x, 2) for x in ours],
            "llama_cpp_tg128_ms_per_token": [round(x, 2) for x in theirs],
            "ortserve_tok_s": round(1e3 / o, 2), "llama_cpp_tok_s": round(1e3 / t, 2) if t else None,
            "ortserve_vs_llama_cpp": round(t / o, 3) if t else None,
            "ortserve_effective_gb_s": round(b["ortserve_bytes"] / o / 1e6, 2),
            "llama_cpp_effective_gb_s": round(b["llama_cpp_bytes"] / t / 1e6, 2) if t else None,
            "read_bandwidth_gb_s": {f"{n}_threads": round(read_bandwidth(n), 2) for n in sorted({1, args.threads})}}
    if args.against:
        result["a_b"] = a_b(Path(args.against), model, args.threads, args.rounds, args.steps)
    result["profile"] = profile(model, args.threads, args.steps)
    result["loadavg_at_end"] = os.getloadavg()
    emit(result)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
