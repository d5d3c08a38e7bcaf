"""Rerank speed: 100 documents against one query with a MiniLM-L6-sized cross-encoder (random
weights, the shape of cross-encoder/ms-marco-MiniLM-L6-v2: 6 layers, 384 wide, BERT vocabulary),
imported through `models import` (ONNX fp32) and run as served (rerank/cross_encoder.py) on
``--threads`` intra-op threads. Documents are ~60-word passages (~72 tokens per pair). JSON on
stdout: the best and median wall seconds per 100-document request over ``--reps``, pairs/s, and
the CPU seconds the process spent per request: on a shared machine the wall time measures the
neighbours too, while CPU seconds / threads estimates the wall time on idle cores.

    .venv/bin/python benchmarks/rerank.py [--threads 2] [--reps 7] [--docs 100]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

WORDS = ["the", "model", "ranks", "each", "passage", "against", "query", "so", "that", "most", "relevant", "text",
         "comes", "first", "while", "retrieval", "keeps", "many", "candidates", "plants", "light", "water", "energy",
         "city", "river", "market", "price", "history", "school", "engine", "memory", "battery", "network", "garden",
         "weather", "bridge", "music", "library", "island", "coffee", "winter"]


def passages(n: int, words: int = 60, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) + "." for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--docs", type=int, default=100)
    args = ap.parse_args()
    from rerank_material import make_cross_encoder

    from ortserve.models.importer import import_path
    from ortserve.models.store import ModelStore
    from ortserve.rerank.cross_encoder import CrossEncoder

    with tempfile.TemporaryDirectory() as tmp:
        src = make_cross_encoder(Path(tmp) / "minilm-l6-shape")
        v = import_path(ModelStore(Path(tmp) / "models"), src, model_id="bench-reranker")
        ce = CrossEncoder(v.model_dir, threads=args.threads)
        query, docs = "how do plants turn light into energy?", passages(args.docs)
        res = ce.score(query, docs)   # warm-up
        times, cpu = [], []
        for _ in range(args.reps):
            t, c = time.perf_counter(), time.process_time()
            ce.score(query, docs)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    print(json.dumps({"benchmark": "rerank", "model": "MiniLM-L6-shaped cross-encoder, random weights, fp32 ONNX",
                      "documents": args.docs, "tokens_per_pair_mean": round(res.prompt_tokens / args.docs, 1),
                      "intra_op_threads": args.threads, "cpus_visible": os.cpu_count(), "reps": args.reps,
                      "best_s": round(min(times), 3), "median_s": round(statistics.median(times), 3),
                      "pairs_per_s": round(args.docs / statistics.median(times), 1),
                      "cpu_s_median": round(statistics.median(cpu), 3),
                      "idle_wall_estimate_s": round(statistics.median(cpu) / args.threads, 3),
                      "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None},
                     indent=2))


if __name__ == "__main__":
    main()
