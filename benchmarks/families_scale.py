"""Streamed GGUF import of Phi-3.5-mini-, Gemma-2-2B- and Gemma-3-1B-shaped files (issue 31):
time and peak RSS of the conversion against the file's size, and (unless --no-speed) decode and
prefill speed against llama.cpp's llama-bench on the same file, in the same run.

    PYTHONPATH=src .venv/bin/python benchmarks/families_scale.py [--shape gemma-2-2b] [--types q4_k_m]
        [--layers N] [--work DIR] [--llama-bin DIR] [--threads 2] [--no-speed] [--no-convert]

Each file has random F16 weights of the family's real shape (``--layers`` cuts the layer count
for a quicker run), a real tokenizer and chat template from llama.cpp's sdist (tests/llamacpp.py:
Phi-3's, and Gemma 4's 262,144-token vocabulary for the Gemma shapes: Gemma 2's own has 256,000),
and is quantized by llama.cpp's ``llama-quantize``. The conversion (gguf_fast.import_gguf_streamed)
runs in a child process whose peak RSS is getrusage's maxrss (benchmarks/scale.py's run_measured).
Prints JSON.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, machine
from scale import llama_tools, ratios, run_measured, speed_child

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import llamacpp

# name: arch, layers, hidden, heads, kv heads, head size, ffn, vocab, template, extra metadata
SHAPES: dict[str, dict[str, Any]] = {
    "phi-3.5-mini": {"arch": "phi3", "layers": 32, "hidden": 3072, "heads": 32, "kv": 32, "head_dim": 96,
                     "ffn": 8192, "vocab": "phi-3", "template": "microsoft-Phi-3.5-mini-instruct",
                     "context": 131072, "original": 4096, "tied": False},
    "gemma-2-2b": {"arch": "gemma2", "layers": 26, "hidden": 2304, "heads": 8, "kv": 4, "head_dim": 256,
                   "ffn": 9216, "vocab": "gemma-4", "template": "google-gemma-2-2b-it", "context": 8192,
                   "window": 4096, "tied": True},
    "gemma-3-1b": {"arch": "gemma3", "layers": 26, "hidden": 1152, "heads": 4, "kv": 1, "head_dim": 256,
                   "ffn": 6912, "vocab": "gemma-4", "template": "google-gemma-2-2b-it", "context": 32768,
                   "window": 512, "tied": True},
}


def metadata(w: Any, s: dict[str, Any], layers: int) -> None:
    import gguf

    w.add_block_count(layers)
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_layer_norm_rms_eps(1e-6 if s["arch"].startswith("gemma") else 1e-5)
    if s["arch"] == "phi3":
        w.add_rope_dimension_count(s["head_dim"])
        w.add_rope_freq_base(10000.0)
        w.add_rope_scaling_orig_ctx_len(s["original"])
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(s["context"] / s["original"]) / np.log(s["original"]))))
        w.add_sliding_window(262144)
    else:
        w.add_sliding_window(s["window"])
    if s["arch"] == "gemma2":
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
    if s["arch"] == "gemma3":
        w.add_rope_freq_base(1000000.0)
        w.add_rope_freq_base_swa(10000.0)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)


def write_f16_gguf(path: Path, shape: str, layers: int, seed: int = 0) -> Path:
    """A random-weight GGUF of ``shape`` in F16 (norms and rope factors F32), written tensor by tensor."""
    import gguf

    s = SHAPES[shape]
    arch, hidden, hd, ffn = s["arch"], s["hidden"], s["head_dim"], s["ffn"]
    src = gguf.GGUFReader(str(llamacpp.vocab(s["vocab"])))
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"random {shape}")
    metadata(w, s, layers)
    for key, f in src.fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    w.add_chat_template(llamacpp.template(s["template"]))
    q, kv = s["heads"] * hd, s["kv"] * hd
    plan: list[tuple[str, tuple[int, ...], Any]] = []
    if arch == "phi3":
        plan += [(f"rope_factors_{k}.weight", (hd // 2,), np.float32) for k in ("long", "short")]
    plan.append(("token_embd.weight", (vocab, hidden), np.float16))
    for i in range(layers):
        norms = ["attn_norm", "ffn_norm"] + (["post_attention_norm", "post_ffw_norm"] if arch != "phi3" else [])
        plan += [(f"blk.{i}.{n}.weight", (hidden,), np.float32) for n in norms]
        if arch == "phi3":
            mats = [("attn_qkv", q + 2 * kv, hidden), ("attn_output", hidden, q), ("ffn_up", 2 * ffn, hidden),
                    ("ffn_down", hidden, ffn)]
        else:
            mats = [("attn_q", q, hidden), ("attn_k", kv, hidden), ("attn_v", kv, hidden), ("attn_output", hidden, q),
                    ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)]
            if arch == "gemma3":
                plan += [(f"blk.{i}.attn_{t}_norm.weight", (hd,), np.float32) for t in "qk"]
        plan += [(f"blk.{i}.{kind}.weight", (rows, cols), np.float16) for kind, rows, cols in mats]
    plan.append(("output_norm.weight", (hidden,), np.float32))
    if not s["tied"]:
        plan.append(("output.weight", (vocab, hidden), np.float16))
    for name, shp, dt in plan:
        w.add_tensor_info(name, list(shp), np.dtype(dt), int(np.prod(shp)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shp, dt in plan:
        if name.startswith("rope_factors"):
            a = rng.uniform(1.0, 4.0 if "long" in name else 1.5, shp).astype(np.float32)
        elif len(shp) == 1:
            a = rng.uniform(0.8, 1.2, shp).astype(np.float32)
        else:
            a = (rng.standard_normal(shp, dtype=np.float32) * 0.02).astype(np.float16)
        w.write_tensor_data(a)
    w.close()
    return path


def make_gguf(work: Path, shape: str, layers: int, qtype: str) -> Path:
    """``work/SHAPE-LAYERS.QTYPE.gguf``, cached: random F16 weights quantized by llama-quantize."""
    stem = f"{shape}-{layers}l"
    out = work / f"{stem}.{qtype}.gguf"
    if out.is_file():
        return out
    f16 = work / f"{stem}.f16.gguf"
    if not f16.is_file():
        write_f16_gguf(f16.with_suffix(".tmp"), shape, layers).rename(f16)
    exe = llamacpp.tool("llama-quantize")
    if exe is None:
        raise SystemExit("no llama-quantize binary (tests/llamacpp.py tool('llama-quantize'))")
    subprocess.run([str(exe), str(f16), str(out.with_suffix(".tmp")), qtype.upper(), "2"], check=True,
                   capture_output=True)
    out.with_suffix(".tmp").rename(out)
    f16.unlink()   # several GB: the quantized file is what the runs read
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="gemma-2-2b", choices=sorted(SHAPES))
    ap.add_argument("--types", nargs="+", default=["q4_k_m"], choices=["q4_k_m", "q8_0"])
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the shape's, for a quicker run")
    ap.add_argument("--work", default=str(Path.home() / ".cache/ortserve-test/scale"))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--no-convert", action="store_true", help="reuse the converted model in --work")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    layers = args.layers or SHAPES[args.shape]["layers"]
    result: dict[str, Any] = {"machine": machine(), "shape": args.shape, "layers": layers, "runs": []}
    for qtype in args.types:
        gguf_file = make_gguf(work, args.shape, layers, qtype)
        size = gguf_file.stat().st_size
        run: dict[str, Any] = {"type": qtype, "gguf_gb": round(size / 1e9, 3)}
        out = work / f"{gguf_file.stem}.onnx"
        if not args.no_convert or not (out / "genai_config.json").is_file():
            shutil.rmtree(out, ignore_errors=True)
            code = ("import sys; from pathlib import Path; from ortserve.models.gguf.fast import import_gguf_streamed;"
                    "print(import_gguf_streamed(Path(sys.argv[1]), Path(sys.argv[2]), smoke=False))")
            run["convert"] = run_measured([sys.executable, "-c", code, str(gguf_file), str(out)])
            run["convert"]["rss_vs_file"] = round(run["convert"]["peak_rss_gb"] * 1e9 / size, 2)
        if not args.no_speed:
            bin_dir = Path(args.llama_bin) if args.llama_bin else None
            run["llama_cpp"] = llama_tools(bin_dir, gguf_file, args.threads)
            # onnxruntime-genai, as in the recorded runs (every position's logits; scale.py now measures
            # the serving Runner first): not yet rerun on these families' Runner
            run["ortserve"] = speed_child(out, args.threads, og=True)
            run["ortserve_vs_llama_cpp"] = ratios(run["ortserve"], run["llama_cpp"])
        result["runs"].append(run)
    emit(result)


if __name__ == "__main__":
    main()
