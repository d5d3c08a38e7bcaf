"""The SQLite layout of the RAG store and the pieces every part of it shares: connections,
the one-writer transaction, ids, migrations.

``rag/index.py`` (files, vector stores, ingestion), ``rag/retrieval.py`` (search) and
``rag/jobs.py`` (background processing) all write through ``tx``; they import it from here,
so none of them reaches back into another.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

MAIN_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
  sha256 TEXT NOT NULL, purpose TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS vector_stores (id TEXT PRIMARY KEY, name TEXT, created_at INTEGER NOT NULL,
  metadata TEXT NOT NULL DEFAULT '{}', embed_model TEXT NOT NULL, last_active_at INTEGER);
CREATE INDEX IF NOT EXISTS vs_name ON vector_stores(name);
"""
STORE_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS vs_files (file_id TEXT PRIMARY KEY, filename TEXT NOT NULL, sha256 TEXT NOT NULL,
  status TEXT NOT NULL, attributes TEXT NOT NULL DEFAULT '{}', chunking TEXT NOT NULL, usage_bytes INTEGER NOT NULL,
  chunks INTEGER NOT NULL DEFAULT 0, last_error TEXT, created_at INTEGER NOT NULL,
  batch_id TEXT, attempts INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS chunks (id INTEGER PRIMARY KEY, file_id TEXT NOT NULL, idx INTEGER NOT NULL,
  text TEXT NOT NULL, start INTEGER NOT NULL, "end" INTEGER NOT NULL, tokens INTEGER NOT NULL,
  hash TEXT NOT NULL, vector BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_file ON chunks(file_id);
CREATE INDEX IF NOT EXISTS chunks_hash ON chunks(hash);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(text, tokenize='porter unicode61');
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL,
  cancelled INTEGER NOT NULL DEFAULT 0);
"""
VS_FILE_COLUMNS = ("file_id, filename, sha256, status, attributes, chunking, usage_bytes, chunks, last_error, "
                   "created_at, batch_id, attempts")


def connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.row_factory = sqlite3.Row
    return con


TX_LOCK = threading.RLock()   # one writer per process at a time; SQLite's lock orders processes


@contextlib.contextmanager
def tx(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    with TX_LOCK:
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:   # SQLite may have rolled back itself (a full disk does)
                with contextlib.suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
            raise


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}" if prefix == "file" else f"{prefix}_{uuid.uuid4().hex[:24]}"


def next_chunk_id(con: sqlite3.Connection, n: int) -> int:
    """The first of ``n`` fresh chunk ids (inside the writer's transaction). Ids are never reused,
    not even those of deleted chunks, so that an in-memory index can tell new chunks by id."""
    r = con.execute("SELECT value FROM meta WHERE key='next_chunk_id'").fetchone()
    top = con.execute("SELECT coalesce(max(id), 0) + 1 FROM chunks").fetchone()[0]
    first = max(int(r[0]) if r else 0, int(top))
    con.execute("INSERT OR REPLACE INTO meta VALUES ('next_chunk_id', ?)", (str(first + n),))
    return first


def migrate(con: sqlite3.Connection) -> None:
    """Stores written before background processing lack vs_files.batch_id/attempts."""
    have = {r[1] for r in con.execute("PRAGMA table_info(vs_files)")}
    if "batch_id" not in have:
        with tx(con):
            con.execute("ALTER TABLE vs_files ADD COLUMN batch_id TEXT")
            con.execute("ALTER TABLE vs_files ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0")
