"""Where one batched decode step's kernel time goes, by weight role (prints JSON).

    .venv/bin/python benchmarks/parallel_profile.py --model /work/bench-home/models/llama-3.2-1b.q4_k_m--q4_k-cpu \
        [--rows 16] [--prompt 128] [--steps 24] [--threads 2] [--spin] [--lib PATH]

The engine's Runner with ``rows`` rows: each row prefilled with ``prompt`` tokens, then ``steps``
decode steps over all rows at once (as 16 parallel streams decode), under ONNX Runtime's
``enable_profiling``. The ``*_kernel_time`` events of the decode steps are summed by part:
each GgufMatMul by its weight's role and ggml type (``q_proj Q4_K``, ``down_proj Q6_K``,
``lm_head Q6_K``), GroupQueryAttention, and the rest by op type. ``step_ms`` is the wall time of
one ``Runner.decode`` (profiling on), ``kernel_ms`` the summed kernel time of a step: with two
threads ParallelFor's work is counted once, so the difference is the graph's own overhead.
``cpu_ms_per_step`` is the process's CPU time in one step (both threads; with spinning off it is
the work done, which a loaded machine's waits do not inflate as they do the wall time).
``--lib`` runs the graph on another build of the ortserve.gguf library (a copy is put in a temp
model folder), to compare two libraries on the same graph.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort
from _common import emit_with_load, model_dir, result_head, runtime_args

from ortserve.engine.runner import ModelSpec, Runner

TYPE_NAMES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}


def roles(onnx_path: Path) -> dict[str, str]:
    """GgufMatMul node name -> ``role type`` (``/model/layers.3/mlp/down_proj/MatMul_Gguf`` ->
    ``down_proj Q6_K``)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    out = {}
    for node in model.graph.node:
        if node.op_type != "GgufMatMul":
            continue
        attrs = {a.name: a.i for a in node.attribute}
        role = "lm_head" if "lm_head" in node.name else node.name.split("/")[-2]
        out[node.name] = f"{role} {TYPE_NAMES.get(attrs['ggml_type'], attrs['ggml_type'])}"
    return out


def with_library(path: Path, lib: str) -> Path:
    """A temp model folder of hard links to ``path``'s files (ONNX Runtime refuses external data
    that a symlink leads out of the folder; same file system), ``lib`` its custom-op library."""
    tmp = Path(tempfile.mkdtemp(prefix="ortserve-prof-"))
    for f in path.iterdir():
        if f.name != "libortserve_gguf.so":
            os.link(f, tmp / f.name)
    shutil.copy(lib, tmp / "libortserve_gguf.so")
    return tmp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--lib", default=None, help="another libortserve_gguf.so to run the graph on")
    runtime_args(ap)
    args = ap.parse_args()
    path, mid = model_dir(args.model)
    head = result_head("parallel_profile", args, model=mid, rows=args.rows, steps=args.steps, prompt=args.prompt,
                       library=args.lib or "model folder's")   # the machine's load at the start
    if args.lib:
        path = with_library(Path(path), args.lib)
    spec = ModelSpec.read(path)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = args.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if args.spin else "0")
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ortserve-ops")
    n = args.rows
    runner = Runner(spec, slots=n, session_options=so)
    rng = np.random.default_rng(0)
    toks = np.zeros(n, dtype=np.int64)
    for r in range(n):
        toks[r] = int(np.argmax(runner.prefill(r, [int(t) for t in rng.integers(1000, 30000, args.prompt)])))
    walls, cpus = [], []
    for _ in range(args.steps):
        t, c = time.perf_counter(), time.process_time()
        logits = runner.decode(toks)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
        toks = np.argmax(logits, axis=-1).astype(np.int64)
    trace = Path(runner.session.end_profiling())
    events = json.loads(trace.read_text(encoding="utf-8"))
    trace.unlink()
    runs = [e for e in events if e.get("name") == "model_run"][-args.steps:]
    start = runs[0]["ts"]
    names = roles(spec.onnx_path)
    if args.lib:
        shutil.rmtree(path)  # links only: the model's own files stay
    us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") != "Node" or e["ts"] < start or not e["name"].endswith("_kernel_time"):
            continue
        node = e["name"].removesuffix("_kernel_time")
        part = names.get(node, e["args"]["op_name"])
        us[part] += e["dur"]
        count[part] += 1
    total = sum(us.values())
    steps = args.steps
    emit_with_load({
          **head,
          "step_ms_median": round(1e3 * float(np.median(walls)), 2),
          "model_run_ms_median": round(float(np.median([e["dur"] for e in runs])) / 1e3, 2),
          "cpu_ms_per_step_median": round(1e3 * float(np.median(cpus)), 2),
          "kernel_ms_per_step": round(total / steps / 1e3, 2),
          "tok_s": round(n / float(np.median(walls)), 1),
          "parts": {k: {"ms_per_step": round(us[k] / steps / 1e3, 3), "share": round(us[k] / total, 4),
                        "nodes_per_step": count[k] // steps} for k in sorted(us, key=lambda k: -us[k])}})


if __name__ == "__main__":
    main()
