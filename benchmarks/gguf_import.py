"""Exact GGUF import vs llama.cpp on the same file: quality and single-stream speed (JSON).

    .venv/bin/python benchmarks/gguf_import.py                 # the default model's Q4_1 GGUF
    .venv/bin/python benchmarks/gguf_import.py --gguf F.gguf --threads 2 --rounds 5 --builders
    .venv/bin/python benchmarks/gguf_import.py --kernels --threads 1   # cost of each exact Q4_1 form

Prints one JSON object: perplexity of the exact import (as shipped, int8 activations in
MatMulNBits, and with fp32 compute) vs the fp32 dequantized reference on the project's
held-out text; decode tokens/s and time to first token for a 256-token prompt, for the
exact model (onnxruntime-genai directly) and llama.cpp (llama-cpp-python), interleaved
round by round with the same thread count, best and median of the rounds; and the bars
of issue 10 (perplexity within 1% of fp32, decode >= 1.0x llama.cpp, TTFT <= llama.cpp).
Progress goes to stderr. Not a timed test: on a shared machine, run it when quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# This file is named gguf.py: keep its directory off the path so `import gguf` finds the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

PROMPT = "The quick brown fox jumps over the lazy dog while the farmer counts his sheep. "
INSTALL_LLAMA = ".venv/bin/pip install llama-cpp-python"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def set_threads(model_dir: Path, threads: int) -> None:
    path = model_dir / "genai_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    opts = cfg["model"]["decoder"].setdefault("session_options", {})
    opts.update(intra_op_num_threads=threads, inter_op_num_threads=1)
    path.write_text(json.dumps(cfg, indent=4), encoding="utf-8")


class OrtRunner:
    """onnxruntime-genai directly: og.Model, og.Generator, append_tokens/generate_next_token."""

    def __init__(self, model_dir: Path) -> None:
        import onnxruntime_genai as og

        self.og, self.model = og, og.Model(str(model_dir))
        self.tokenizer = og.Tokenizer(self.model)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def run(self, prompt: list[int], new_tokens: int) -> tuple[float, float]:
        """(TTFT seconds, decode tokens/s) for one greedy generation."""
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + new_tokens + 1, do_sample=False)
        gen = self.og.Generator(self.model, params)
        t0 = time.perf_counter()
        gen.append_tokens(prompt)
        gen.generate_next_token()
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):
            gen.generate_next_token()
        t2 = time.perf_counter()
        return t1 - t0, (new_tokens - 1) / (t2 - t1)


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python on the same GGUF file, greedy."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         n_batch=512, verbose=False)

    def run(self, prompt: list[int], new_tokens: int) -> tuple[float, float]:
        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t2 = time.perf_counter()
        return t1 - t0, (new_tokens - 1) / (t2 - t1)


def summarize(samples: list[tuple[float, float]]) -> dict[str, float]:
    ttft = [s[0] * 1000 for s in samples]
    tps = [s[1] for s in samples]
    return {"decode_tps_best": round(max(tps), 1), "decode_tps_median": round(statistics.median(tps), 1),
            "ttft_ms_best": round(min(ttft), 1), "ttft_ms_median": round(statistics.median(ttft), 1)}


def speed(runners: dict[str, Callable[[list[int], int], tuple[float, float]]], prompt: list[int],
          new_tokens: int, rounds: int) -> dict[str, dict[str, float]]:
    """Interleave the runners round by round (load on a shared machine hits all alike)."""
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in runners}
    for name, run in runners.items():
        run(prompt, 8)   # warm-up
    for r in range(rounds):
        for name, run in runners.items():
            samples[name].append(run(prompt, new_tokens))
            say(f"round {r + 1}/{rounds} {name}: ttft {samples[name][-1][0] * 1000:.0f} ms, "
                f"decode {samples[name][-1][1]:.1f} tok/s")
    return {k: summarize(v) for k, v in samples.items()}


def quality(model_dir: Path, ref_dir: Path) -> dict[str, Any]:
    from ortserve.models.gguf.exact import with_accuracy_level
    from ortserve.models.quality import perplexity

    ref = perplexity(ref_dir)["perplexity"]
    shipped = perplexity(model_dir)
    fp32_dir = model_dir.with_name(model_dir.name + "-fp32compute")
    shutil.copytree(model_dir, fp32_dir)
    with_accuracy_level(fp32_dir, 0, name="model.onnx")
    fp32c = perplexity(fp32_dir)["perplexity"]
    shutil.rmtree(fp32_dir)
    return {"tokens": shipped["tokens"], "reference_fp32": round(ref, 4),
            "exact": round(shipped["perplexity"], 4),
            "exact_delta_pct": round(100 * (shipped["perplexity"] / ref - 1), 3),
            "exact_fp32_compute": round(fp32c, 4),
            "exact_fp32_compute_delta_pct": round(100 * (fp32c / ref - 1), 4)}


def builder_variants(hf: Path, work: Path, ref: float) -> dict[str, Any]:
    from ortserve.models import convert
    from ortserve.models.quality import perplexity

    out = {}
    for p in ("int4", "int8"):
        shutil.rmtree(work / p, ignore_errors=True)
        d = convert.build_onnx(hf, work / p, precision=p)
        ppl = perplexity(d)["perplexity"]
        out[p] = {"perplexity": round(ppl, 4), "delta_pct": round(100 * (ppl / ref - 1), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, help="GGUF file (default: the embedded SmolLM2-135M Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--builders", action="store_true", help="also the builder's int4/int8 re-quantizations")
    ap.add_argument("--work", type=Path, help="work dir to keep (default: a temp dir, removed)")
    ap.add_argument("--reuse", action="store_true", help="reuse the import and builds already in --work")
    ap.add_argument("--kernels", action="store_true",
                    help="only the micro-benchmark of the exact Q4_1 forms (a chain of 576x576 MatMuls)")
    args = ap.parse_args()
    if args.kernels:
        print(json.dumps({"threads": args.threads, **kernel_forms(args.threads)}, indent=2))
        return

    from ortserve.models.catalog import embedded_gguf
    from ortserve.models.gguf.exact import import_gguf_exact

    gguf = (args.gguf or embedded_gguf()).resolve()
    work = args.work or Path(tempfile.mkdtemp(prefix="ortserve-gguf-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        exact, saved = work / "exact", work / "exact-report.json"
        if args.reuse and saved.is_file():
            report, q, import_s = json.loads(saved.read_text(encoding="utf-8")).values()
        else:
            shutil.rmtree(exact, ignore_errors=True)
            t0 = time.monotonic()
            report = import_gguf_exact(gguf, exact, work, progress=say)
            import_s = time.monotonic() - t0
            ref_dir = Path(report.pop("reference_dir"))
            say("measuring perplexity")
            q = quality(exact, ref_dir)
            saved.write_text(json.dumps({"report": report, "quality": q, "seconds": import_s}), encoding="utf-8")
        result: dict[str, Any] = {"gguf": gguf.name, "threads": args.threads, "cpus": os.cpu_count(),
                                  "import_seconds": round(import_s, 1), "exact_import": report, "perplexity": q}
        runners: dict[str, Any] = {}
        set_threads(exact, args.threads)
        ort_exact = OrtRunner(exact)
        runners["ortserve_exact"] = ort_exact.run
        if args.builders:
            built = {k.removeprefix("builder_"): v for k, v in q.items() if k.startswith("builder_")}
            if not (args.reuse and built):
                built = builder_variants(work / "hf", work, q["reference_fp32"])
            for name, b in built.items():
                set_threads(work / name, args.threads)
                q[f"builder_{name}"] = {k: v for k, v in b.items() if k != "dir"}
                runners[f"builder_{name}"] = OrtRunner(work / name).run
            saved.write_text(json.dumps({"report": report, "quality": q, "seconds": import_s}), encoding="utf-8")
        prompt = ort_exact.encode(PROMPT * (args.prompt_tokens // 8 + 8))[:args.prompt_tokens]
        try:
            runners["llama_cpp"] = LlamaCppRunner(gguf, args.threads, args.prompt_tokens + args.new_tokens + 64).run
        except ImportError:
            result["llama_cpp"] = {"skipped": f"llama-cpp-python is not installed ({INSTALL_LLAMA})"}
        say(f"speed: {args.rounds} rounds, prompt {len(prompt)} tokens, {args.new_tokens} new tokens")
        load_before = os.getloadavg()[0]
        sp = speed(runners, prompt, args.new_tokens, args.rounds)
        result["speed"] = sp
        # Other processes on the machine skew both engines (llama.cpp's spinning OpenMP threads most).
        result["load_average_1min"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
        result["bars"] = bars(q, sp)
        print(json.dumps(result, indent=2))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def kernel_forms(threads: int, k: int = 576, layers: int = 100) -> dict[str, float]:
    """µs per 576x576 layer for the exact forms of a Q4_1 MatMul, in a chain of ``layers``
    nodes with M=1 (decode): integer kernel alone (not exact: no minimum), plus the minimum
    term (indicator MatMul or Reshape+ReduceSum), and a float zero point instead."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nb, rng = k // 32, np.random.default_rng(0)

    def session(form: str) -> Any:
        eye = np.zeros((k, nb), np.float32)
        eye[np.arange(k), np.arange(k) // 32] = 1
        inits = [numpy_helper.from_array(eye, "IND"), numpy_helper.from_array(np.array([0, 0, nb, 32]), "SHP"),
                 numpy_helper.from_array(np.array([-1]), "AX")]
        nodes, x = [], "x0"
        for i in range(layers):
            inits += [numpy_helper.from_array(rng.integers(0, 256, (k, nb, 16), dtype=np.uint8), f"B{i}"),
                      numpy_helper.from_array((rng.random((k, nb)) * 1e-3).astype(np.float32), f"S{i}"),
                      numpy_helper.from_array((rng.random((nb, k)) * 1e-3).astype(np.float32), f"O{i}"),
                      numpy_helper.from_array((rng.random((k, nb)) * 8).astype(np.float32), f"Z{i}")]
            y, q = f"x{i + 1}", f"q{i}"
            ins = [x, f"B{i}", f"S{i}"] + ([f"Z{i}"] if form == "float_zero_point" else [])
            out = y if form in ("integer_only", "float_zero_point") else q
            nodes.append(helper.make_node("MatMulNBits", ins, [out], domain="com.microsoft", K=k, N=k, bits=4,
                                          block_size=32, accuracy_level=4))
            if form == "indicator":
                nodes.append(helper.make_node("MatMul", [x, "IND"], [f"s{i}"]))
            elif form == "reshape_reducesum":
                nodes += [helper.make_node("Reshape", [x, "SHP"], [f"r{i}"]),
                          helper.make_node("ReduceSum", [f"r{i}", "AX"], [f"s{i}"], keepdims=0)]
            if out == q:
                nodes += [helper.make_node("MatMul", [f"s{i}", f"O{i}"], [f"m{i}"]),
                          helper.make_node("Add", [q, f"m{i}"], [y])]
            x = y
        graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, 1, k])],
                                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1, k])], inits)
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                       helper.make_opsetid("com.microsoft", 1)])
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.log_severity_level = threads, 3
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    forms = ("integer_only", "indicator", "reshape_reducesum", "float_zero_point")
    sessions = {f: session(f) for f in forms}
    x0 = rng.random((1, 1, k), dtype=np.float32)
    best = dict.fromkeys(forms, float("inf"))
    for _ in range(5):
        for f, sess in sessions.items():
            reps = 3 if f == "float_zero_point" else 30
            sess.run(None, {"x0": x0})
            t0 = time.perf_counter()
            for _ in range(reps):
                sess.run(None, {"x0": x0})
            best[f] = min(best[f], (time.perf_counter() - t0) / reps / layers * 1e6)
    return {f"{f}_us_per_layer": round(v, 2) for f, v in best.items()}


def bars(q: dict[str, Any], sp: dict[str, dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"perplexity_within_1pct": abs(q["exact_delta_pct"]) <= 1.0}
    if "llama_cpp" in sp:
        ours, theirs = sp["ortserve_exact"], sp["llama_cpp"]
        out["decode_vs_llama_cpp"] = round(ours["decode_tps_best"] / theirs["decode_tps_best"], 3)
        out["decode_vs_llama_cpp_median"] = round(ours["decode_tps_median"] / theirs["decode_tps_median"], 3)
        out["ttft_vs_llama_cpp"] = round(ours["ttft_ms_best"] / theirs["ttft_ms_best"], 3)
        out["decode_at_least_llama_cpp"] = out["decode_vs_llama_cpp"] >= 1.0
        out["ttft_at_most_llama_cpp"] = out["ttft_vs_llama_cpp"] <= 1.0
    return out


if __name__ == "__main__":
    main()
