"""Where prefill and 16-row decode time go on a streamed GGUF import (issue 31), printed as JSON.

    PYTHONPATH=src .venv/bin/python benchmarks/prefill_profile.py --gguf FILE.gguf --model IMPORTED_DIR
        [--threads 2] [--tokens 512] [--rows 16] [--prompt 40] [--steps 16] [--rounds 2]
        [--llama-bin DIR] [--no-speed]

The compute-bound half of decode_profile.py: a 512-token prefill and a decode step over 16 rows
read the weights once for many tokens, so their time is arithmetic, not bytes. On the same file:

* ``speed``: ortserve's Runner (the serving path: logits of the last position only) prefilling
  ``--tokens`` tokens, the same with the graph as exported (logits for every position, what
  onnxruntime-genai and so ``benchmarks/scale.py`` run), and a decode step over ``--rows`` rows
  after ``--prompt``-token prompts; beside ``llama-bench -p TOKENS -n 0`` and
  ``llama-batched-bench`` (``--rows`` x (``--prompt`` + 64)), interleaved for ``--rounds`` rounds.
* ``profile``: ONNX Runtime's profiler (``enable_profiling``) over each of the three, kernel time
  summed by kind per run (decode_profile.kernel_kind: MatMulNBits by bits/block, ``+ min term``
  where a Q4_K minimum is added to the node's output, the minimum term's own nodes, attention,
  the LM head, the rest by op type), with each matrix kind's GFLOP/s (2 x M x K x N over its
  kernel time; M = tokens in the run, or logit rows for the LM head).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, machine
from decode_profile import kernel_kind, llama_bench, runner_for


def matrix_nodes(model: Path) -> tuple[dict[str, Any], set[str], dict[str, tuple[int, int]]]:
    """The graph's nodes by name, the MatMulNBits owners that carry a minimum term, and each
    matrix node's (K, N): MatMulNBits from its attributes, the minimum's offsets from their shape."""
    import onnx

    spec = json.loads((model / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    graph = onnx.load(str(model / spec.get("filename", "model.onnx")), load_external_data=False).graph
    dims = {t.name: tuple(t.dims) for t in graph.initializer}
    nodes = {n.name: n for n in graph.node}
    mins = {n.name.removesuffix("/gguf_min") for n in graph.node if n.name.endswith("/gguf_min")}
    kn: dict[str, tuple[int, int]] = {}
    for n in graph.node:
        if n.op_type == "MatMulNBits":
            a = {x.name: x.i for x in n.attribute}
            kn[n.name] = (a["K"], a["N"])
        elif n.op_type == "MatMul" and len(dims.get(n.input[1], ())) == 2:
            kn[n.name] = dims[n.input[1]]
    return nodes, mins, kn


def kind_of(node: Any | None, op: str, mins: set[str]) -> str:
    k = kernel_kind(node, op)
    if node is not None and op == "MatMulNBits" and node.name.rsplit("/", 1)[0] in mins:
        k += " + min term"
    return k


def kernel_sums(events: list[dict[str, Any]], runs: list[dict[str, Any]], graph: tuple[Any, ...],
                tokens: int, logit_rows: int) -> dict[str, Any]:
    """Kernel time per run by kind over the ``runs`` (model_run events), with matrix GFLOP/s."""
    nodes, mins, kn = graph
    windows = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    flop: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        if not any(a <= e["ts"] <= b for a, b in windows):
            continue
        name = e["name"].removesuffix("_kernel_time")
        k = kind_of(nodes.get(name), e["args"]["op_name"], mins)
        us[k] += e["dur"]
        count[k] += 1
        if name in kn:
            m = logit_rows if name.startswith("/lm_head/") else tokens
            flop[k] += 2.0 * m * kn[name][0] * kn[name][1]
    n = len(runs)
    total = sum(us.values())
    kinds = {}
    for k in sorted(us, key=lambda k: -us[k]):
        kinds[k] = {"ms_per_run": round(us[k] / n / 1e3, 2), "share": round(us[k] / total, 4),
                    "nodes_per_run": count[k] // n}
        if flop[k]:
            kinds[k]["gflop_per_run"] = round(flop[k] / n / 1e9, 4)
            kinds[k]["gflop_s"] = round(flop[k] / us[k] / 1e3, 1)
    return {"runs": n, "tokens": tokens, "logit_rows": logit_rows,
            "model_run_ms_median": round(float(np.median([r["dur"] for r in runs])) / 1e3, 2),
            "kernel_ms_per_run": round(total / n / 1e3, 2), "kinds": kinds}


def prompt(tokens: int, seed: int = 0) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(1000, 100000, tokens)]


def prefill_s(runner: Any, ids: list[int]) -> float:
    t = time.perf_counter()
    runner.prefill(0, ids)
    dt = time.perf_counter() - t
    runner.clear(0)
    return dt


def rows_decode_s(runner: Any, rows: int, prompt_len: int, steps: int) -> float:
    """Median seconds per decode step over ``rows`` rows, each after its own ``prompt_len``-token prefill."""
    tok = np.array([int(np.argmax(runner.prefill(r, prompt(prompt_len, r)))) for r in range(rows)])
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        tok = np.argmax(runner.decode(tok), axis=1).astype(np.int64)
        times.append(time.perf_counter() - t)
    for r in range(rows):
        runner.clear(r)
    return float(np.median(times))


def llama_pp(bin_dir: Path, gguf: Path, threads: int, tokens: int) -> float | None:
    return llama_bench(bin_dir, gguf, threads, tokens, 0)


def llama_batched(bin_dir: Path, gguf: Path, threads: int, rows: int, prompt_len: int) -> dict[str, float] | None:
    exe = bin_dir / "llama-batched-bench"
    if not exe.is_file():
        return None
    out = subprocess.run([str(exe), "-m", str(gguf), "-c", "2048", "-b", "2048", "-ub", "512", "-npp",
                          str(prompt_len), "-ntg", "64", "-npl", str(rows), "-t", str(threads), "--output-format",
                          "jsonl"], check=False, capture_output=True, text=True)
    got = [json.loads(x) for x in (out.stdout + "\n" + out.stderr).splitlines() if x.startswith("{")]
    return {"total_tok_s": got[0]["speed"], "prefill_tok_s": got[0]["speed_pp"],
            "decode_tok_s": got[0]["speed_tg"]} if got else None


def speed(args: argparse.Namespace, model: Path, gguf: Path) -> dict[str, Any]:
    last = runner_for(model, args.threads, profile=False, slots=args.rows)
    every = runner_for(model, args.threads, profile=False, last_logits_only=False)
    ids, bin_dir = prompt(args.tokens), Path(args.llama_bin)
    prefill_s(last, ids), prefill_s(every, ids), rows_decode_s(last, args.rows, args.prompt, 2)   # warm-up
    got: dict[str, list[Any]] = defaultdict(list)
    for _ in range(args.rounds):   # interleaved: the load drifts
        got["last"].append(args.tokens / prefill_s(last, ids))
        got["every"].append(args.tokens / prefill_s(every, ids))
        got["llama_pp"].append(llama_pp(bin_dir, gguf, args.threads, args.tokens))
        got["rows"].append(args.rows / rows_decode_s(last, args.rows, args.prompt, args.steps))
        got["llama_batched"].append(llama_batched(bin_dir, gguf, args.threads, args.rows, args.prompt))
    med = {k: float(np.median(v)) for k, v in got.items() if v and isinstance(v[0], float)}
    lb = [b for b in got["llama_batched"] if b]
    llama_tg = float(np.median([b["decode_tok_s"] for b in lb])) if lb else None
    r = {k: [round(x, 2) for x in v] if isinstance(v[0], float) else v for k, v in got.items() if v and v[0]}
    return {
        "per_round": r,
        f"pp{args.tokens}_tok_s": {"ortserve_last_logits": round(med["last"], 2),
                                   "ortserve_every_logits": round(med["every"], 2),
                                   "llama_bench": round(med["llama_pp"], 2) if "llama_pp" in med else None},
        f"pp{args.tokens}_vs_llama_cpp": {k: round(med[k] / med["llama_pp"], 3) for k in ("last", "every")}
        if "llama_pp" in med else None,
        f"decode_{args.rows}_rows_tok_s": {"ortserve": round(med["rows"], 2),
                                           "llama_batched_bench": round(llama_tg, 2) if llama_tg else None},
        f"decode_{args.rows}_rows_vs_llama_cpp": round(med["rows"] / llama_tg, 3) if llama_tg else None}


def profiled(model: Path, threads: int, work: Any, runs: int, graph: tuple[Any, ...], tokens: int,
             logit_rows: int, **runner_kw: Any) -> dict[str, Any]:
    """kernel_sums over the last ``runs`` session runs of ``work(runner)`` on a profiling Runner."""
    runner = runner_for(model, threads, profile=True, **runner_kw)
    work(runner)
    trace = Path(runner.session.end_profiling())
    events = json.loads(trace.read_text(encoding="utf-8"))
    trace.unlink()
    last = [e for e in events if e.get("name") == "model_run"][-runs:]
    return kernel_sums(events, last, graph, tokens, logit_rows)


def profile(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    graph, ids = matrix_nodes(model), prompt(args.tokens)

    def prefills(runner: Any) -> None:
        for _ in range(1 + args.rounds):   # the first is a warm-up
            prefill_s(runner, ids)

    def rows(runner: Any) -> None:
        rows_decode_s(runner, args.rows, args.prompt, args.steps)

    return {"prefill_last_logits": profiled(model, args.threads, prefills, args.rounds, graph, args.tokens, 1),
            "prefill_every_logits": profiled(model, args.threads, prefills, args.rounds, graph, args.tokens,
                                             args.tokens, last_logits_only=False),
            f"decode_{args.rows}_rows": profiled(model, args.threads, rows, args.steps, graph, args.rows,
                                                 args.rows, slots=args.rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--model", required=True, help="the imported model directory (benchmarks/scale.py's *.onnx)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512, help="prefill length (llama-bench -p)")
    ap.add_argument("--rows", type=int, default=16, help="rows decoded together")
    ap.add_argument("--prompt", type=int, default=40, help="each row's prompt before the decode steps")
    ap.add_argument("--steps", type=int, default=16, help="decode steps over --rows rows")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN",
                                                          str(Path.home() / ".cache/ortserve-test/llama.cpp/build/bin")))
    ap.add_argument("--no-speed", action="store_true", help="the kernel profile only")
    args = ap.parse_args()
    gguf, model = Path(args.gguf), Path(args.model)
    result: dict[str, Any] = {"benchmark": "prefill_profile", "gguf": gguf.name, "machine": machine(),
                              "threads": args.threads, "tokens": args.tokens, "rows": args.rows}
    if not args.no_speed:
        result["speed"] = speed(args, model, gguf)
    result["profile"] = profile(args, model)
    result["loadavg_at_end"] = os.getloadavg()
    emit(result)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
