"""Retrieval quality on a shipped document set: recall@5 and MRR for dense, BM25 and hybrid.

The documents are a frozen copy of this project's README and docs (tests/data/rag_docs/);
each of the held-out questions (tests/data/rag_questions.json) names a short verbatim answer
passage, and a retrieved chunk is relevant when it contains that passage. Prints JSON.

The fusion settings in rag/search.py (RRF k and weights) were chosen on the *tuning* half
(even-numbered questions, 0-based) only; the *heldout* half (odd-numbered) was not used to
choose anything. Each mode is reported on both halves and on all questions ("all": the 60),
and on a *fresh* set (tests/data/rag_questions_fresh.json) written after the settings were fixed.

    .venv/bin/python benchmarks/rag_quality.py [--chunk-tokens 200 --overlap 40]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "tests" / "data" / "rag_docs"
QUESTIONS = ROOT / "tests" / "data" / "rag_questions.json"
# 22 questions written after the fusion settings were fixed, never used to choose anything
FRESH = ROOT / "tests" / "data" / "rag_questions_fresh.json"
MODES = ("dense", "bm25", "hybrid")


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().lower()


def evaluate(rag: Any, vid: str, questions: list[dict[str, str]], splits: dict[str, list[int]],
             k: int = 5) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        firsts: list[int | None] = []
        for q in questions:
            hits = rag.search(vid, q["q"], k=10, mode=mode)
            ranks = [i for i, h in enumerate(hits, 1) if norm(q["answer"]) in norm(h["content"][0]["text"])]
            firsts.append(ranks[0] if ranks else None)
        out[mode] = {}
        for split, ids in splits.items():
            recall = sum(1 for i in ids if firsts[i] is not None and firsts[i] <= k)
            rr = sum(1.0 / firsts[i] for i in ids if firsts[i])
            out[mode][split] = {"questions": len(ids), "recall@5": round(recall / len(ids), 4),
                                "mrr@10": round(rr / len(ids), 4)}
        out[mode]["misses"] = [q["q"] for q, f in zip(questions, firsts, strict=True) if f is None or f > k]
    return out


def build(root: Path, chunk_tokens: int, overlap: int) -> tuple[Any, str, dict[str, Any]]:
    from ortserve.config import load_settings
    from ortserve.models.store import ModelStore
    from ortserve.rag.index import RagStore
    from ortserve.server.embed_holder import EmbeddingHolder

    settings = load_settings()
    variant, emb = EmbeddingHolder(ModelStore(settings.store_dir), settings.embedding_model).get()
    rag = RagStore(root, lambda: emb)
    vid = rag.create_store("docs", None, variant.id)["id"]
    chunks = 0

    def count(n: int) -> None:
        nonlocal chunks
        chunks += n

    t = time.perf_counter()
    for f in sorted(DOCS.iterdir()):
        rag.ingest_path(vid, f, f.name, max_tokens=chunk_tokens, overlap=overlap, progress=count)
    took = time.perf_counter() - t
    return rag, vid, {"embedding_model": variant.id, "chunks": chunks, "ingest_s": round(took, 2),
                      "chunks_per_s": round(chunks / took, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk-tokens", type=int, default=200)
    ap.add_argument("--overlap", type=int, default=40)
    a = ap.parse_args()
    questions = json.loads(QUESTIONS.read_text(encoding="utf-8"))
    fresh = json.loads(FRESH.read_text(encoding="utf-8"))
    n = len(questions)
    splits = {"tune": list(range(0, n, 2)), "heldout": list(range(1, n, 2)), "all": list(range(n)),
              "fresh": list(range(n, n + len(fresh)))}
    import os

    with tempfile.TemporaryDirectory() as tmp:
        rag, vid, info = build(Path(tmp), a.chunk_tokens, a.overlap)
        result = {"questions": n, "fresh_questions": len(fresh), "documents": len(list(DOCS.iterdir())), **info,
                  "chunk_tokens": a.chunk_tokens, "overlap": a.overlap, "load_average": os.getloadavg()[0],
                  **evaluate(rag, vid, questions + fresh, splits)}
        rag.close()
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
