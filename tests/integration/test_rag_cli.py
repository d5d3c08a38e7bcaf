"""`ortserve rag` and `ortserve ask --store` end to end on the default models; kill -9 mid-ingest."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "ortserve.cli.main"]
DOCS = {
    "tea.md": "# Tea\n\nTo brew green tea, heat the water to about 80 degrees Celsius and steep the leaves "
              "for two minutes. Boiling water makes green tea bitter.",
    "castle.html": "<html><body><h1>Castle</h1><p>The drawbridge of Blackmoor castle is raised every night at "
                   "ten o'clock.</p></body></html>",
    "bikes.txt": "A bicycle chain should be cleaned and oiled every 300 kilometres, more often in rain.",
}


def run(args: list[str], cwd: Path, rag: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORTSERVE_RAG_DIR": str(rag)}
    return subprocess.run(CLI + args, capture_output=True, text=True, env=env, timeout=600, cwd=cwd,
                          check=False, encoding="utf-8", errors="replace")


def test_ingest_ls_search_ask_replace_rm(default_model: Path, embedding_model: Path, tmp_path: Path) -> None:
    docs, rag = tmp_path / "docs", tmp_path / "rag"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    (docs / "photo.png").write_bytes(b"\x89PNG....")      # skipped by the directory walk
    r = run(["rag", "ingest", "docs", "--store", "kb"], tmp_path, rag)
    assert r.returncode == 0, r.stderr
    assert "3 added" in r.stdout and "ingesting into kb" in r.stderr     # the progress bar
    r = run(["rag", "ingest", "docs", "--store", "kb"], tmp_path, rag)
    assert "0 added, 0 replaced, 3 unchanged" in r.stdout
    listed = run(["rag", "ls", "kb"], tmp_path, rag).stdout
    assert all(f"docs/{n}" in listed for n in DOCS)
    hits = json.loads(run(["rag", "search", "--store", "kb", "when is the drawbridge raised?", "--json"],
                          tmp_path, rag).stdout)
    assert hits[0]["filename"] == "docs/castle.html" and "ten o'clock" in hits[0]["content"][0]["text"]

    r = run(["ask", "--store", "kb", "How hot should the water be for green tea?", "--json", "--max-tokens", "40",
             "--temperature", "0"], tmp_path, rag)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"][0]
    assert res["answer"].strip() and res["citations"][0]["filename"] == "docs/tea.md"
    assert {"index", "file_id", "filename", "chunk_index", "start", "end", "score"} <= set(res["citations"][0])
    text = run(["ask", "--store", "kb", "How often should a bicycle chain be oiled?", "--max-tokens", "30"],
               tmp_path, rag).stdout
    assert "Sources:" in text and "[1] docs/bikes.txt (chunk 0" in text

    (docs / "bikes.txt").write_text("Clean a bicycle chain with degreaser; wax it every 500 kilometres.")
    assert "1 replaced, 2 unchanged" in run(["rag", "ingest", "docs", "--store", "kb"], tmp_path, rag).stdout
    hits = json.loads(run(["rag", "search", "--store", "kb", "bicycle chain", "--json"], tmp_path, rag).stdout)
    texts = [h["content"][0]["text"] for h in hits if h["filename"] == "docs/bikes.txt"]
    assert texts == ["Clean a bicycle chain with degreaser; wax it every 500 kilometres."]

    assert run(["rag", "rm", "kb", "--file", "docs/tea.md"], tmp_path, rag).returncode == 0
    assert "docs/tea.md" not in run(["rag", "ls", "kb"], tmp_path, rag).stdout
    assert run(["rag", "rm", "kb"], tmp_path, rag).returncode == 0
    r = run(["ask", "--store", "kb", "anything?"], tmp_path, rag)
    assert r.returncode == 1 and "no vector store named 'kb'" in r.stderr


def _consistent(db: Path) -> tuple[int, int]:
    """Every completed file has exactly its chunks, vectors and BM25 rows; returns (files, chunks)."""
    con = sqlite3.connect(db)
    files = con.execute("SELECT file_id, chunks FROM vs_files WHERE status='completed'").fetchall()
    for fid, n in files:
        assert con.execute("SELECT count(*) FROM chunks WHERE file_id=?", (fid,)).fetchone()[0] == n
    total = con.execute("SELECT count(*) FROM chunks").fetchone()[0]
    assert total == sum(n for _, n in files)
    assert con.execute("SELECT count(*) FROM chunks_fts").fetchone()[0] == total
    assert con.execute("SELECT count(*) FROM chunks WHERE length(vector) <> 384 * 4").fetchone()[0] == 0
    con.close()
    return len(files), total


def test_kill_9_during_ingest_then_rerun_completes(embedding_model: Path, tmp_path: Path) -> None:
    docs, rag = tmp_path / "many", tmp_path / "rag"
    docs.mkdir()
    for i in range(30):
        body = " ".join(f"Document {i} sentence {j} talks about topic {i * 7 + j} in detail." for j in range(60))
        (docs / f"doc{i:02}.txt").write_text(body)
    env = {**os.environ, "ORTSERVE_RAG_DIR": str(rag)}
    proc = subprocess.Popen(CLI + ["rag", "ingest", "many", "--store", "big"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            dbs = list((rag / "stores").glob("*.sqlite")) if (rag / "stores").is_dir() else []
            if dbs:
                try:
                    con = sqlite3.connect(dbs[0])
                    done = con.execute("SELECT count(*) FROM vs_files").fetchone()[0]
                    con.close()
                except sqlite3.OperationalError:
                    done = 0
                if done >= 3:
                    break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    db = next((rag / "stores").glob("*.sqlite"))
    files, _ = _consistent(db)
    assert 3 <= files < 30, "the kill should land mid-ingest"
    r = run(["rag", "ingest", "many", "--store", "big", "--json"], tmp_path, rag)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["unchanged"]) == files and len(out["added"]) == 30 - files
    assert _consistent(db)[0] == 30
    assert len(json.loads(run(["rag", "ls", "big", "--json"], tmp_path, rag).stdout)) == 30
