"""Variants of the default model: size, perplexity vs fp32, decode tokens/s on CPU.

    .venv/bin/python benchmarks/variants.py            # JSON on stdout
    .venv/bin/python benchmarks/variants.py --markdown # plus the docs/models.md table on stderr

Builds fp32, int8, int4, int4 k_quant with an int8 LM head, and the exact import of the
GGUF's own Q4_1 blocks, from the embedded SmolLM2-135M-Instruct GGUF, through the same code
the store uses (convert.build_onnx, gguf_exact, quality.perplexity on the shipped held-out
text, speed.decode_tps through ortserve's runner).
Takes a few minutes on 2 cores; nothing is written to the model store.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ortserve.models import convert
from ortserve.models.catalog import DEFAULT_PRECISION, embedded_gguf
from ortserve.models.importer import quant_options, variant_name
from ortserve.models.quality import perplexity
from ortserve.models.speed import decode_tps

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("fp32", {}),
    ("int8", {}),
    ("int4", {}),
    ("int4", quant_options(algo="k_quant", last_matmul="int8")),
]


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build_exact(hf: Path, work: Path) -> tuple[str, Path]:
    """The GGUF's own blocks mapped onto MatMulNBits (issue 10, models/gguf/exact.py)."""
    from ortserve.models.gguf import exact as gguf_exact

    gguf = embedded_gguf()
    name = variant_name(gguf_exact.exact_precision(gguf_exact.preflight(gguf)), "cpu")
    out = work / name
    gguf_exact.import_gguf_exact(gguf, out, work / "exact-work", hf_dir=hf)
    return name, out


def run(work: Path, tokens: int, repeats: int, exact: bool) -> dict[str, Any]:
    hf = convert.gguf_to_hf(embedded_gguf(), work / "hf")
    rows: list[dict[str, Any]] = []
    plan: list[tuple[str, dict[str, Any]]] = VARIANTS + ([("exact", {})] if exact else [])
    for precision, options in plan:
        t0 = time.monotonic()
        if precision == "exact":
            name, out = build_exact(hf, work)
        else:
            name = variant_name(precision, "cpu", options)
            out = work / name
            convert.build_onnx(hf, out, precision=precision, device="cpu", options=options)
        build_s = time.monotonic() - t0
        ppl = perplexity(out)
        speed = decode_tps(out, tokens=tokens, repeats=repeats)
        rows.append({"variant": name, "precision": name.split("-")[0], "options": options,
                     "size_mb": round(dir_size(out) / 1e6, 1), "perplexity": round(ppl["perplexity"], 3),
                     "tokens_scored": ppl["tokens"], "decode_tps": speed["decode_tps"],
                     "build_s": round(build_s, 1)})
        print(f"{name}: {rows[-1]}", file=sys.stderr)
    ref = rows[0]["perplexity"]
    for r in rows:
        r["delta_pct"] = round(100 * (r["perplexity"] / ref - 1), 2)
    within = [r for r in rows if r["delta_pct"] <= 1.0]
    fastest = max(within, key=lambda r: r["decode_tps"])
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {"model": "smollm2-135m", "machine": f"{platform.machine()} {platform.processor()}".strip(),
            "cpus": os.cpu_count(), "load_average_1_5_15": load,
            "decode_tokens": tokens, "default_precision": DEFAULT_PRECISION,
            "fastest_within_1pct": fastest["variant"], "variants": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| variant | size (MB) | perplexity | vs fp32 | decode tok/s (1 stream, CPU) |",
             "|---|---:|---:|---:|---:|"]
    for r in result["variants"]:
        lines.append(f"| {r['variant']} | {r['size_mb']} | {r['perplexity']:.3f} | {r['delta_pct']:+.2f}% "
                     f"| {r['decode_tps']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128, help="decode tokens per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per variant (best is kept)")
    ap.add_argument("--keep", type=Path, default=None, help="build into this dir and keep it")
    ap.add_argument("--markdown", action="store_true", help="also print the table (stderr)")
    ap.add_argument("--no-exact", action="store_true", help="skip the exact GGUF-block variant")
    args = ap.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = run(args.keep, args.tokens, args.repeats, not args.no_exact)
    else:
        with tempfile.TemporaryDirectory(prefix="ortserve-variants-") as tmp:
            result = run(Path(tmp), args.tokens, args.repeats, not args.no_exact)
    print(json.dumps(result, indent=2))
    if args.markdown:
        print(markdown(result), file=sys.stderr)


if __name__ == "__main__":
    main()
