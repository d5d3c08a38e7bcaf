"""Which tenant owns each file and vector store (issue 45): the ``owners`` table of the main database.

A table beside ``files`` and ``vector_stores`` rather than a column in them, so that their rows,
their positional INSERTs and the objects the API returns stay as they are; an id is never reused
(random uuids), so a row left by a deleted object names nothing. The server
(``server/tenancy.py``) writes a row when a keyed tenant creates an object and filters by them;
objects created without a key file (the CLI, ``ORTSERVE_API_KEY``, a keyless server, a store from
before this table) have none, and only an all-seeing key sees them.
"""

from __future__ import annotations

import sqlite3

SCHEMA = """CREATE TABLE IF NOT EXISTS owners (kind TEXT NOT NULL, id TEXT NOT NULL, owner TEXT NOT NULL,
  PRIMARY KEY (kind, id))"""
CREATE_INDEX = "CREATE INDEX IF NOT EXISTS owners_by_owner ON owners(owner, kind)"


def migrate(con: sqlite3.Connection) -> None:
    """Create the table in a store that lacks it (idempotent, safe beside another process)."""
    con.execute(SCHEMA)
    con.execute(CREATE_INDEX)


def claim(con: sqlite3.Connection, kind: str, oid: str, owner: str) -> None:
    con.execute("INSERT OR REPLACE INTO owners VALUES (?, ?, ?)", (kind, oid, owner))


def owner(con: sqlite3.Connection, kind: str, oid: str) -> str | None:
    row = con.execute("SELECT owner FROM owners WHERE kind=? AND id=?", (kind, oid)).fetchone()
    return str(row[0]) if row else None


def owned(con: sqlite3.Connection, kind: str, who: str) -> set[str]:
    return {r[0] for r in con.execute("SELECT id FROM owners WHERE kind=? AND owner=?", (kind, who))}
