"""Single-thread throughput of the native GGUF kernels (src/ortserve/native/csrc/kernels_*.c).

For each type: M=1 (decode) in GB/s of weight bytes as the file holds them, and M=64 (prefill) in
GFLOP/s (2*K*N*M), on a weight bigger than the last-level cache, per instruction-set path.

    .venv/bin/python benchmarks/native_kernels.py --json out.json

With --vs-ggml DIR (a llama.cpp build's bin folder, holding libggml-base.so and libggml-cpu.so; see
docs/bench.md "llama.cpp tools"), it instead runs benchmarks/native_kernels_vs_ggml.c: the same
weight bytes through these kernels and through ggml's own from_float + vec_dot, alternating, one
thread, best of many, at M=1 (K=4096, N=256: in L2, so compute, not memory) and M=64 (N=128):

    .venv/bin/python benchmarks/native_kernels.py --vs-ggml ~/.cache/ortserve-test/llama.cpp/build/bin
"""
from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ortserve.native import reference as ref

CSRC = Path(__file__).resolve().parents[1] / "src" / "ortserve" / "native" / "csrc"


def load(path: str | None) -> ctypes.CDLL:
    if path is None:
        out = Path(tempfile.mkdtemp()) / "libosg.so"
        cc = shutil.which("cc") or "gcc"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), *map(str, sorted(CSRC.glob("kernels*.c")))],
                       check=True)
        path = str(out)
    so = ctypes.CDLL(path)
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    so.osg_row_bytes.restype = so.osg_act_row_bytes.restype = ctypes.c_size_t
    so.osg_row_bytes.argtypes = so.osg_act_row_bytes.argtypes = [ctypes.c_int, i64]
    so.osg_quantize_act.argtypes = [ctypes.c_int, vp, vp, i64]
    so.osg_matmul_rows.argtypes = [ctypes.c_int, i64, vp, vp, i64, vp, i64, i64, i64]
    so.osg_isa.restype = ctypes.c_char_p
    so.osg_set_isa.argtypes = [ctypes.c_char_p]
    return so


def best_of(fn, repeat: int) -> float:
    """Best of `repeat` calls in this thread's CPU time: one thread, so on a loaded machine the
    time other processes hold the core is not counted (the wall clock swung 5x at load 20)."""
    times = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return min(times)


def bench(so: ctypes.CDLL, t: int, k: int, n: int, m: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    be, bb = ref.BLOCK[t]
    w = rng.integers(0, 256, size=(n, k // be, bb), dtype=np.uint8)
    off = bb - 2 if t == ref.Q6_K else 0              # the fp16 scale: finite, so no NaN/inf slows the floats
    w[..., off:off + 2] = np.array([0.01], np.float16).view(np.uint8)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ab = so.osg_act_row_bytes(t, k)
    xq = np.zeros((m, ab), np.uint8)
    y = np.zeros((m, n), np.float32)

    def quant() -> None:
        for i in range(m):
            so.osg_quantize_act(t, x[i].ctypes.data, xq[i].ctypes.data, k)

    def run() -> None:
        so.osg_matmul_rows(t, k, w.ctypes.data, xq.ctypes.data, m, y.ctypes.data, n, 0, n)

    quant()
    run()
    secs = best_of(run, repeat)
    wbytes = so.osg_row_bytes(t, k) * n
    return {"type": ref.NAMES[t], "k": k, "n": n, "m": m, "seconds": secs,
            "weight_GB_per_s": wbytes / secs / 1e9, "GFLOP_per_s": 2 * k * n * m / secs / 1e9}


def vs_ggml(so_path: str, bin_dir: Path, types: list[str], ms: list[int]) -> list[dict]:
    exe = Path(tempfile.mkdtemp()) / "vs_ggml"
    cc = shutil.which("cc") or "gcc"
    subprocess.run([cc, "-O2", "-o", str(exe), str(Path(__file__).with_name("native_kernels_vs_ggml.c")), "-ldl"],
                   check=True)
    by_name = {v: k for k, v in ref.NAMES.items()}
    rows = []
    for name in types:
        for k, n, m, repeat in [(4096, 256, 1, 400) if m == 1 else (4096, 128, m, max(4, 3840 // m)) for m in ms]:
            out = subprocess.run([str(exe), so_path, str(bin_dir / "libggml-base.so"), str(bin_dir / "libggml-cpu.so"),
                                  str(by_name[name]), str(k), str(n), str(m), str(repeat), "-"],
                                 check=True, capture_output=True, text=True).stdout
            r = json.loads(out)
            r["type"] = name
            r["ratio_ggml_over_ortserve"] = r["ggml_s"] / r["ortserve_s"]
            rows.append(r)
            print(f"{r['isa']:>10} {name:5} M={m:<3} ortserve {r['ortserve_s'] * 1e6:9.1f} us   ggml "
                  f"{r['ggml_s'] * 1e6:9.1f} us   x{r['ratio_ggml_over_ortserve']:.2f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="a built library (default: compile the kernel sources here)")
    ap.add_argument("--isa", nargs="*", default=["scalar", "avx2", "avx512"])
    ap.add_argument("--types", nargs="*", default=["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=8192, help="rows for M=1 (default: ~19-36 MB of weights)")
    ap.add_argument("--prefill-n", type=int, default=1024, help="rows for M=64")
    ap.add_argument("--m", type=int, nargs="*", default=[1, 64],
                    help="activation rows (1 runs on --n rows, others on --prefill-n)")
    ap.add_argument("--baseline", help="another built library, timed alternately with --lib (ratios)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--vs-ggml", type=Path, metavar="BIN_DIR", help="compare with libggml-cpu in BIN_DIR")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.vs_ggml:
        if args.lib is None:
            so = load(None)
            args.lib = so._name
        rows = vs_ggml(args.lib, args.vs_ggml.expanduser(), args.types, args.m)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
        return
    so = load(args.lib)
    base = load(args.baseline) if args.baseline else None
    by_name = {v: k for k, v in ref.NAMES.items()}
    rows = []
    for isa in args.isa:
        if so.osg_set_isa(isa.encode()) != 0 or (base is not None and base.osg_set_isa(isa.encode()) != 0):
            continue
        for name in args.types:
            t = by_name[name]
            for m in args.m:
                n = args.n if m == 1 else args.prefill_n
                r = bench(so, t, args.k, n, m, args.repeat)
                if base is not None:   # alternate: the best of each, taken in turns
                    b = bench(base, t, args.k, n, m, args.repeat)
                    for _ in range(2):
                        r = min(r, bench(so, t, args.k, n, m, args.repeat), key=lambda v: v["seconds"])
                        b = min(b, bench(base, t, args.k, n, m, args.repeat), key=lambda v: v["seconds"])
                    r["baseline_GFLOP_per_s"] = b["GFLOP_per_s"]
                r["isa"] = so.osg_isa().decode()
                rows.append(r)
                extra = f"  baseline {r['baseline_GFLOP_per_s']:8.1f} GFLOP/s" if base is not None else ""
                print(f"{r['isa']:>10} {name:5} M={m:<3} {r['weight_GB_per_s']:7.2f} GB/s  "
                      f"{r['GFLOP_per_s']:8.1f} GFLOP/s  ({r['seconds'] * 1e3:.2f} ms){extra}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
