"""Stored responses (``store: true``), for ``previous_response_id`` and GET/DELETE /v1/responses/{id}.

One SQLite file in the home directory, so a conversation survives a restart. A row holds the
response object as it was returned, and the conversation up to and including its output as
plain chat messages (without ``instructions``, which OpenAI does not carry to the next turn).
Each row is written in one transaction: a response is stored whole or not at all.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from ortserve import faults

SCHEMA = """CREATE TABLE IF NOT EXISTS responses (
  id TEXT PRIMARY KEY, created REAL NOT NULL, model TEXT NOT NULL,
  history TEXT NOT NULL, response TEXT NOT NULL)"""


class ResponseStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")   # a returned id is a promise: the row survives a crash
            db.execute(SCHEMA)
            if "owner" not in {r[1] for r in db.execute("PRAGMA table_info(responses)")}:
                db.execute("ALTER TABLE responses ADD COLUMN owner TEXT")   # the key that stored it (issue 45)
            self._db = db
        return self._db

    def put(self, response: dict[str, Any], history: list[dict[str, Any]], owner: str | None = None) -> None:
        with self._lock:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("INSERT OR REPLACE INTO responses (id, created, model, history, response, owner) "
                           "VALUES (?, ?, ?, ?, ?, ?)", (response["id"], time.time(), response["model"],
                                                         json.dumps(history), json.dumps(response), owner))
                faults.point("responses.commit")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise

    def get(self, rid: str, owner: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The stored response and its history; another owner's is None, as a missing one."""
        with self._lock:
            row = self._conn().execute("SELECT response, history FROM responses WHERE id = ? AND "
                                       "(owner IS ? OR ? IS NULL)", (rid, owner, owner)).fetchone()
        return (json.loads(row[0]), json.loads(row[1])) if row else None

    def delete(self, rid: str, owner: str | None = None) -> bool:
        with self._lock:
            return self._conn().execute("DELETE FROM responses WHERE id = ? AND (owner IS ? OR ? IS NULL)",
                                        (rid, owner, owner)).rowcount > 0

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
