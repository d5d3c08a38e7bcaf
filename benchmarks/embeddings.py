"""Embeddings and retrieval speed, one run, JSON on stdout.

1. Sentences/s: ortserve's onnxruntime runner (fp32 and int8 variants) vs sentence-transformers
   on PyTorch, same model (all-MiniLM-L6-v2), same sentences, alternating rep by rep; each side
   batches its own way (sentence-transformers: sorted by length, ``--batch`` per run, default 32
   as in its encode(); ortserve: sorted by length, a padded-token budget per run); cosine of
   each ortserve vector with sentence-transformers' vector for the same input.
2. Ingest: chunks/s for the shipped document set (tests/data/rag_docs) through RagStore.
3. Search latency p50/p99 at 10k and 100k chunks (synthetic texts and unit vectors written
   straight into a store, 50 chunks per file with consecutive ids as add_to_store writes them),
   for dense, BM25 and hybrid; the query is embedded each time. Hybrid is also measured with
   the query on a second, 1-thread session (alternating query by query). Then the parts of a
   hybrid query alone (the old exact int8 pass beside the binary pass), and the first search
   after one more file is committed (index refresh).
4. Recall of the binary candidate pass against the exact float32 ranking, on 100k real MiniLM
   embeddings (docstring paragraphs; embedded once, cached under $ORTSERVE_HOME/bench).

    .venv/bin/pip install -e '.[bench]'        # sentence-transformers, usearch: references only
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


def exact_int8(idx: Any, q8: np.ndarray, q: np.ndarray, k: int) -> list[int]:
    """The dense pass before the binary one, for reference: usearch's exact int8 inner products
    on all cores, 4k candidates re-scored in float32."""
    from usearch.index import MetricKind
    from usearch.index import search as exact_search

    qi = np.clip(np.round(q * 127), -127, 127).astype(np.int8)
    cand = np.asarray(exact_search(q8, qi, max(4 * k, 64), MetricKind.IP, exact=True, threads=0).keys, np.int64)
    exact = np.einsum("ij,j->i", idx.vectors[cand], q)
    return [int(idx.ids[cand[i]]) for i in np.argsort(-exact)[:k]]


def search_latency(size: int, queries: int = 60) -> dict[str, Any]:
    from ortserve.config import load_settings
    from ortserve.engine.embed import Embedder
    from ortserve.models.store import ModelStore
    from ortserve.rag.index import RagStore
    from ortserve.server.embed_holder import EmbeddingHolder

    settings = load_settings()
    variant, emb = EmbeddingHolder(ModelStore(settings.store_dir), settings.embedding_model).get()
    # the alternative measured beside the served path: queries on a second, 1-thread session
    one = Embedder(emb.model_dir, threads=1)
    current = [emb]
    rng = np.random.default_rng(0)
    rnd = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        rag = RagStore(Path(tmp), lambda: current[0])
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
        for mode in ("dense", "bm25"):
            lat = []
            for q in qs:
                t = time.perf_counter()
                rag.search(vid, q, k=10, mode=mode)
                lat.append(time.perf_counter() - t)
            out[mode] = {"p50_ms": round(1000 * pct(lat, 0.5), 2), "p99_ms": round(1000 * pct(lat, 0.99), 2)}
        # hybrid as served (the query on the embedder's session, onnxruntime's default threads)
        # and with the query on a second 1-thread session, alternating query by query
        hyb: dict[str, list[float]] = {"hybrid": [], "hybrid_query_session_1_thread": []}
        for i, q in enumerate(qs + qs):
            name = "hybrid" if i % 2 == 0 else "hybrid_query_session_1_thread"
            current[0] = emb if i % 2 == 0 else one
            t = time.perf_counter()
            rag.search(vid, q, k=10, mode="hybrid")
            hyb[name].append(time.perf_counter() - t)
        current[0] = emb
        for name, lat in hyb.items():
            out[name] = {"p50_ms": round(1000 * pct(lat, 0.5), 2), "p99_ms": round(1000 * pct(lat, 0.99), 2)}
        lat = []
        for q in qs[:20]:
            t = time.perf_counter()
            rag.search(vid, q, k=10, mode="hybrid", filters={"type": "eq", "key": "group", "value": 3})
            lat.append(time.perf_counter() - t)
        out["hybrid_filtered_10pct"] = {"p50_ms": round(1000 * pct(lat, 0.5), 2)}
        # where a hybrid query's time goes: each part alone, same queries; the old exact int8
        # pass (usearch, all cores, then float32 re-score) beside the binary pass for reference
        con, idx = rag._store(vid), rag._dense_index(vid)
        parts: dict[str, list[float]] = {"query_embedding": [], "query_embedding_1_thread_session": [],
                                         "dense_pass": [], "dense_pass_exact_int8": [], "bm25_fts5": []}
        q8 = np.clip(np.round(idx.vectors * 127), -127, 127).astype(np.int8)
        for q in qs:
            t = time.perf_counter()
            qv = emb.embed_texts([q], truncate=True).vectors[0]
            parts["query_embedding"].append(time.perf_counter() - t)
            t = time.perf_counter()
            one.embed_texts([q], truncate=True)
            parts["query_embedding_1_thread_session"].append(time.perf_counter() - t)
            t = time.perf_counter()
            idx.search(qv, 40)
            parts["dense_pass"].append(time.perf_counter() - t)
            t = time.perf_counter()
            exact_int8(idx, q8, qv, 40)
            parts["dense_pass_exact_int8"].append(time.perf_counter() - t)
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


CORPUS_BLOCK = 5000


def docstring_corpus(n: int) -> list[str]:
    """``n`` real English paragraphs, the same on every run with the same packages: docstring
    paragraphs (40-400 characters, mostly letters) of the Python standard library and the
    installed packages, de-duplicated and ordered by their SHA-1."""
    import hashlib
    import re
    import sysconfig

    found: set[str] = set()
    quoted = re.compile(r'"""(.*?)"""', re.DOTALL)
    for root in sorted({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}):
        for path in sorted(Path(root).rglob("*.py")):
            try:
                src = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            for doc in quoted.findall(src):
                for para in re.split(r"\n\s*\n", doc):
                    t = " ".join(para.split())
                    if 40 <= len(t) <= 400 and sum(c.isalpha() or c == " " for c in t) > 0.85 * len(t):
                        found.add(t)
    texts = sorted(found, key=lambda t: hashlib.sha1(t.encode()).hexdigest())
    if len(texts) < n:
        raise SystemExit(f"only {len(texts)} docstring paragraphs here; ask for fewer")
    return texts[:n]


def real_vectors(texts: list[str], emb: Any, cache: Path, max_blocks: int) -> np.ndarray | None:
    """Embeddings of ``texts`` (truncated to 64 tokens), computed CORPUS_BLOCK at a time and kept
    under ``cache``: a long embedding job can be split over several runs (--max-blocks)."""
    import hashlib

    cache.mkdir(parents=True, exist_ok=True)
    out = []
    done = 0
    for b in range(0, len(texts), CORPUS_BLOCK):
        block = texts[b:b + CORPUS_BLOCK]
        key = hashlib.sha1(("\n".join(block) + emb.model_dir.name).encode()).hexdigest()[:16]
        path = cache / f"block-{key}.npy"
        if not path.exists():
            if done >= max_blocks:
                return None
            seqs = [s if len(s) <= 64 else s[:64 - len(emb.suffix)] + list(emb.suffix) for s in emb.tokenize(block)]
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, emb.embed_ids(seqs).vectors)
            tmp.replace(path)
            done += 1
            print(f"embedded block {b // CORPUS_BLOCK + 1} of {-(-len(texts) // CORPUS_BLOCK)}",
                  file=sys.stderr, flush=True)
        out.append(np.load(path))
    return np.concatenate(out)


def dense_recall(size: int, max_blocks: int, queries: int = 300) -> dict[str, Any]:
    """The binary coarse pass against the exact float32 ranking on real MiniLM embeddings: recall@10
    and recall@40 (the hybrid pool), and the dense pass's time, for a few candidate counts.
    Queries: the shipped RAG questions, and held-out docstring paragraphs (not in the store)."""
    from ortserve.config import load_settings
    from ortserve.models.store import ModelStore
    from ortserve.rag import search as S
    from ortserve.server.embed_holder import EmbeddingHolder

    settings = load_settings()
    variant, emb = EmbeddingHolder(ModelStore(settings.store_dir), settings.embedding_model).get()
    texts = docstring_corpus(size + queries)
    vecs = real_vectors(texts[:size], emb, Path(settings.home) / "bench" / "docstring-corpus", max_blocks)
    if vecs is None:
        return {"chunks": size, "incomplete": "run again to embed the remaining blocks"}
    qtexts = [q["q"] for f in ("rag_questions.json", "rag_questions_fresh.json")
              for q in json.loads((ROOT / "tests" / "data" / f).read_text(encoding="utf-8"))]
    qtexts += texts[size:size + queries - len(qtexts)]
    qv = emb.embed_texts(qtexts, truncate=True).vectors
    idx = S.DenseIndex(0, np.arange(1, size + 1, dtype=np.int64), vecs)
    truth = [np.argsort(-S._dot(vecs, q), kind="stable")[:40] + 1 for q in qv]
    out: dict[str, Any] = {"chunks": size, "queries": len(qtexts), "model": variant.id}
    saved = S.COARSE_MIN, S.COARSE_PER_RESULT, S.COARSE_SHARE
    try:
        for c in (250, 500, 1000, 2000, 4000, 0):    # 0: the shipped setting, last
            if c:
                S.COARSE_MIN, S.COARSE_PER_RESULT, S.COARSE_SHARE = c, 0, 0.0
            else:
                S.COARSE_MIN, S.COARSE_PER_RESULT, S.COARSE_SHARE = saved
            r10 = r40 = 0.0
            lat = []
            for q, t in zip(qv, truth, strict=True):
                s = time.perf_counter()
                got = [cid for cid, _ in idx.search(q, 40)]
                lat.append(time.perf_counter() - s)
                r10 += len(set(got[:10]) & set(t[:10].tolist())) / 10
                r40 += len(set(got) & set(t.tolist())) / 40
            out[f"candidates_{c}" if c else "shipped"] = {"recall@10": round(r10 / len(qv), 4), "recall@40": round(r40 / len(qv), 4),
                                      "p50_ms": round(1000 * pct(lat, 0.5), 2), "p99_ms": round(1000 * pct(lat, 0.99), 2)}
    finally:
        S.COARSE_MIN, S.COARSE_PER_RESULT, S.COARSE_SHARE = saved
    lat = []
    for q in qv:
        s = time.perf_counter()
        S._dot(vecs, q)
        lat.append(time.perf_counter() - s)
    out["exact_float32_p50_ms"] = round(1000 * pct(lat, 0.5), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sentences", type=int, default=512)
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=60, help="search queries per mode")
    ap.add_argument("--skip", default="", help="comma list of: throughput, ingest, search, recall")
    ap.add_argument("--recall-size", type=int, default=100000, help="chunks of real embeddings for the recall part")
    ap.add_argument("--max-blocks", type=int, default=1000,
                    help=f"embed at most this many new blocks of {CORPUS_BLOCK} corpus texts in this run")
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
            result["search"].append(search_latency(int(s), a.queries))
            print(json.dumps({"search": result["search"][-1]}), file=sys.stderr, flush=True)
    if "recall" not in skip:
        part("recall", dense_recall(a.recall_size, a.max_blocks))
    result["load_average_end"] = os.getloadavg()[0]
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
