"""Retrieval quality on a shipped document set: recall@5 and MRR for dense, BM25 and hybrid.

The documents are a frozen copy of this project's README and docs (tests/data/rag_docs/);
each of the held-out questions (tests/data/rag_questions.json) names a short verbatim answer
passage, and a retrieved chunk is relevant when it contains that passage. Prints JSON.

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
MODES = ("dense", "bm25", "hybrid")


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().lower()


def evaluate(rag: Any, vid: str, questions: list[dict[str, str]], k: int = 5) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        recall, rr, misses = 0, 0.0, []
        for q in questions:
            hits = rag.search(vid, q["q"], k=10, mode=mode)
            ranks = [i for i, h in enumerate(hits, 1) if norm(q["answer"]) in norm(h["content"][0]["text"])]
            first = ranks[0] if ranks else None
            recall += first is not None and first <= k
            rr += 1.0 / first if first else 0.0
            if first is None or first > k:
                misses.append(q["q"])
        n = len(questions)
        out[mode] = {"recall@5": round(recall / n, 4), "mrr@10": round(rr / n, 4), "misses": misses}
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
    import os

    with tempfile.TemporaryDirectory() as tmp:
        rag, vid, info = build(Path(tmp), a.chunk_tokens, a.overlap)
        result = {"questions": len(questions), "documents": len(list(DOCS.iterdir())), **info,
                  "chunk_tokens": a.chunk_tokens, "overlap": a.overlap, "load_average": os.getloadavg()[0],
                  **evaluate(rag, vid, questions)}
        rag.close()
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
