"""Embeddings and retrieval speed, one run, JSON on stdout.

1. Sentences/s: ortserve's onnxruntime runner (fp32 and int8 variants) vs sentence-transformers
   on PyTorch, same model (all-MiniLM-L6-v2), same sentences, alternating rep by rep; each side
   batches its own way (sentence-transformers: sorted by length, ``--batch`` per run, default 32
   as in its encode(); ortserve: sorted by length, a padded-token budget per run); cosine of
   each ortserve vector with sentence-transformers' vector for the same input.
2. Ingest: chunks/s for the shipped document set (tests/data/rag_docs) through RagStore.
3. Search latency p50/p99 at 10k and 100k chunks (synthetic texts and unit vectors written
   straight into a store, 50 chunks per file with consecutive ids as add_to_store writes them),
   for dense, BM25 and hybrid; the query is embedded each time. Then the parts of a hybrid
   query alone, and the first search after one more file is committed (index refresh).

    .venv/bin/pip install -e '.[bench]'        # sentence-transformers, for the reference only
    .venv/bin/python benchmarks/embeddings.py [--reps 3] [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def sentences(n: int) -> list[str]:
    from ortserve.models.embed_import import heldout_sentences

    base = heldout_sentences()
    docs = (ROOT / "tests" / "data" / "rag_docs" / "README.md").read_text(encoding="utf-8").split("\n\n")
    paras = [" ".join(p.split()) for p in docs if 80 < len(p) < 900]
    pool = base + paras
    return [pool[i % len(pool)] for i in range(n)]


def throughput(reps: int, batch: int, n: int) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    from ortserve.config import load_settings
    from ortserve.engine.embed import Embedder
    from ortserve.models.catalog import embedded_embedding_dir
    from ortserve.models.embed_import import embedding_variants
    from ortserve.models.store import ModelStore

    texts = sentences(n)
    st = SentenceTransformer(str(embedded_embedding_dir()), device="cpu")
    ours = {v.precision: Embedder(v.model_dir) for v in embedding_variants(ModelStore(load_settings().store_dir))}
    ref = st.encode(texts, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True)
    times: dict[str, list[float]] = {"sentence-transformers": [], **{f"ortserve-{p}": [] for p in ours}}
    for _ in range(reps):   # alternate sides rep by rep: load changes hit both alike
        t = time.perf_counter()
        st.encode(texts, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True)
        times["sentence-transformers"].append(time.perf_counter() - t)
        for p, e in ours.items():
            t = time.perf_counter()
            e.embed_texts(texts, truncate=True)
            times[f"ortserve-{p}"].append(time.perf_counter() - t)
    out: dict[str, Any] = {"sentences": n, "batch": batch, "reps": reps}
    base = n / min(times["sentence-transformers"])
    out["sentence-transformers"] = {"sentences_per_s": round(base, 1)}
    for p, e in ours.items():
        v = e.embed_texts(texts, truncate=True).vectors
        cos = np.sum(v * ref, axis=1)
        sps = n / min(times[f"ortserve-{p}"])
        out[f"ortserve-{p}"] = {"sentences_per_s": round(sps, 1), "speedup": round(sps / base, 2),
                                "cosine_mean": round(float(cos.mean()), 6), "cosine_min": round(float(cos.min()), 6)}
    return out


def ingest_rate() -> dict[str, Any]:
    from rag_quality import build

    with tempfile.TemporaryDirectory() as tmp:
        rag, _, info = build(Path(tmp), 200, 40)
        rag.close()
    return info


WORDS = [f"w{i}" for i in range(20000)]


def search_latency(size: int, queries: int = 60) -> dict[str, Any]:
    from ortserve.config import load_settings
    from ortserve.models.store import ModelStore
    from ortserve.rag.index import RagStore
    from ortserve.server.embed_holder import EmbeddingHolder

    settings = load_settings()
    variant, emb = EmbeddingHolder(ModelStore(settings.store_dir), settings.embedding_model).get()
    rng = np.random.default_rng(0)
    rnd = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        rag = RagStore(Path(tmp), lambda: emb)
        vid = rag.create_store("synthetic", None, variant.id)["id"]
        rag._store(vid)
        con = sqlite3.connect(Path(tmp) / "stores" / f"{vid}.sqlite")
        t = time.perf_counter()
        con.execute("BEGIN")
        files = max(1, size // 50)
        for f in range(files):
            con.execute("INSERT INTO vs_files (file_id, filename, sha256, status, attributes, chunking, "
                        "usage_bytes, chunks, last_error, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                        (f"file-{f}", f"doc{f}.txt", "0", "completed", json.dumps({"group": f % 10}),
                         "{}", 0, 50, None, 0))
        for i in range(size):
            v = rng.standard_normal(emb.dimensions).astype(np.float32)
            v /= np.linalg.norm(v)
            text = " ".join(rnd.choices(WORDS, k=60))
            cur = con.execute('INSERT INTO chunks (file_id, idx, text, start, "end", tokens, hash, vector) '
                              "VALUES (?,?,?,?,?,?,?,?)", (f"file-{i * files // size}", i % 50, text, 0, len(text), 60,
                                                          str(i), v.tobytes()))
            con.execute("INSERT INTO chunks_fts(rowid, text) VALUES (?,?)", (cur.lastrowid, text))
        con.execute("UPDATE meta SET value = value + 1 WHERE key='generation'")
        con.execute("COMMIT")
        con.close()
        build_s = time.perf_counter() - t
        t = time.perf_counter()
        rag.search(vid, "warm up the index", k=10, mode="dense")
        load_s = time.perf_counter() - t
        out: dict[str, Any] = {"chunks": size, "write_s": round(build_s, 1), "first_search_s": round(load_s, 2)}
        qs = [" ".join(rnd.choices(WORDS, k=6)) for _ in range(queries)]
        for mode in ("dense", "bm25", "hybrid"):
            lat = []
            for q in qs:
                t = time.perf_counter()
                rag.search(vid, q, k=10, mode=mode)
                lat.append(time.perf_counter() - t)
            out[mode] = {"p50_ms": round(1000 * pct(lat, 0.5), 2), "p99_ms": round(1000 * pct(lat, 0.99), 2)}
        lat = []
        for q in qs[:20]:
            t = time.perf_counter()
            rag.search(vid, q, k=10, mode="hybrid", filters={"type": "eq", "key": "group", "value": 3})
            lat.append(time.perf_counter() - t)
        out["hybrid_filtered_10pct"] = {"p50_ms": round(1000 * pct(lat, 0.5), 2)}
        # where a hybrid query's time goes: each part alone, same queries
        con, idx = rag._store(vid), rag._dense_index(vid)
        parts: dict[str, list[float]] = {"query_embedding": [], "dense_pass": [], "bm25_fts5": []}
        for q in qs:
            t = time.perf_counter()
            qv = emb.embed_texts([q], truncate=True).vectors[0]
            parts["query_embedding"].append(time.perf_counter() - t)
            t = time.perf_counter()
            idx.search(qv, 40)
            parts["dense_pass"].append(time.perf_counter() - t)
            t = time.perf_counter()
            rag._bm25(con, idx, q, 40, None)
            parts["bm25_fts5"].append(time.perf_counter() - t)
        out["parts_p50_ms"] = {name: round(1000 * pct(lat, 0.5), 2) for name, lat in parts.items()}
        # one more file of 50 chunks committed (as the background worker does): the next search
        # refreshes the in-memory index instead of reading all vectors again (first_search_s)
        fid = rag.add_file("late.txt", ("late text " * 40).encode())["id"]
        rag.add_to_store(vid, fid, max_tokens=32, overlap=0)
        t = time.perf_counter()
        rag.search(vid, qs[0], k=10, mode="hybrid")
        out["search_after_a_new_file_s"] = round(time.perf_counter() - t, 3)
        rag.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sentences", type=int, default=512)
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--skip", default="", help="comma list of: throughput, ingest, search")
    a = ap.parse_args()
    skip = set(a.skip.split(","))
    result: dict[str, Any] = {"load_average_start": os.getloadavg()[0], "cores": os.cpu_count()}
    def part(name: str, value: Any) -> None:   # each phase to stderr as it finishes (long runs)
        result[name] = value
        print(json.dumps({name: value}), file=sys.stderr, flush=True)

    if "throughput" not in skip:
        part("throughput", throughput(a.reps, a.batch, a.sentences))
    if "ingest" not in skip:
        part("ingest", ingest_rate())
    if "search" not in skip:
        part("search", [])
        for s in a.sizes.split(","):
            result["search"].append(search_latency(int(s)))
            print(json.dumps({"search": result["search"][-1]}), file=sys.stderr, flush=True)
    result["load_average_end"] = os.getloadavg()[0]
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
