"""What batch invariance costs: sentences/s of the int8 MiniLM run one input per session run
(as served since issue 45, batch-invariant) vs the old length-sorted batches (a vector moved
with its batch mates), and fp32 batched, on the held-out sentences; alternating rep by rep.
JSON on stdout.

    .venv/bin/python benchmarks/embed_per_row.py [--reps 5] [--sentences 256]
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources
from typing import Any

import numpy as np

from ortserve.config import load_settings
from ortserve.engine.embed import Embedder
from ortserve.models.embed_import import embedding_variants, ensure_default_embedding
from ortserve.models.store import ModelStore


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sentences", type=int, default=256)
    args = ap.parse_args()
    store = ModelStore(load_settings().store_dir)
    ensure_default_embedding(store, subprocess_import=False)
    dirs = {v.precision: v.path for v in embedding_variants(store)}
    text = resources.files("ortserve.data").joinpath("embed_heldout.txt").read_text(encoding="utf-8")
    sentences = [s for s in text.splitlines() if s.strip()][:args.sentences]
    int8, fp32 = Embedder(dirs["int8"]), Embedder(dirs["fp32"])
    int8_batched = Embedder(dirs["int8"])
    int8_batched.per_row = False
    sides: dict[str, Any] = {"int8 per row (served)": int8, "int8 batched (before)": int8_batched,
                             "fp32 batched (served)": fp32}
    best = {k: float("inf") for k in sides}
    for e in sides.values():
        e.embed_texts(sentences[:16], truncate=True)
    for _ in range(args.reps):
        for name, e in sides.items():
            t = time.perf_counter()
            e.embed_texts(sentences, truncate=True)
            best[name] = min(best[name], time.perf_counter() - t)
    alone = int8.embed_texts([sentences[0]]).vectors[0]
    print(json.dumps({
        "sentences": len(sentences), "reps": args.reps,
        "sentences_per_s": {k: round(len(sentences) / v, 1) for k, v in best.items()},
        "per_row_cost": round(best["int8 per row (served)"] / best["int8 batched (before)"], 3),
        "int8_batched_max_abs_diff_vs_alone": float(np.abs(
            int8_batched.embed_texts(sentences[:8]).vectors[0] - alone).max()),
    }, indent=2))


if __name__ == "__main__":
    main()
