"""What requests cost: a price table (USD per million tokens, local = 0) and a SQLite ledger
with one row per answered request, so `ortserve costs` can total them and show the savings
against sending everything to the default cloud model."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ortserve import faults
from ortserve.types import Usage


class Price(BaseModel):
    """USD per million tokens."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)

    def cost(self, usage: Usage) -> float:
        return (usage.prompt_tokens * self.input + usage.completion_tokens * self.output) / 1_000_000


# List prices at the time of writing; a provider's `prices` in the routing config wins.
# Keys are matched against the model id with any "vendor/" prefix removed, dots read as
# dashes, and the longest key that starts the id winning ("claude-3-5-haiku-20241022").
BUILTIN_PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-3-opus": (15.0, 75.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
    "gpt-4o-mini": (0.15, 0.6),
    "gpt-4o": (2.5, 10.0),
    "gpt-4-1-nano": (0.1, 0.4),
    "gpt-4-1-mini": (0.4, 1.6),
    "gpt-4-1": (2.0, 8.0),
    "o3-mini": (1.1, 4.4),
    "o4-mini": (1.1, 4.4),
}


def _normal(model: str) -> str:
    return model.rsplit("/", maxsplit=1)[-1].lower().replace(".", "-").split(":")[0]


class PriceTable:
    def __init__(self, overrides: Mapping[str, Mapping[str, Price]] | None = None) -> None:
        self.overrides = {p: dict(m) for p, m in (overrides or {}).items()}

    def price(self, provider: str, model: str, local: bool) -> Price | None:
        if local:
            return Price(input=0.0, output=0.0)
        own = self.overrides.get(provider, {})
        if model in own:
            return own[model]
        if model.endswith(":free"):  # OpenRouter's free variants
            return Price(input=0.0, output=0.0)
        norm = _normal(model)
        best = max((k for k in BUILTIN_PRICES if norm.startswith(k)), key=len, default=None)
        if best is None:
            return None
        i, o = BUILTIN_PRICES[best]
        return Price(input=i, output=o)

    def cost(self, provider: str, model: str, local: bool, usage: Usage) -> float | None:
        p = self.price(provider, model, local)
        return None if p is None else round(p.cost(usage), 8)


SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    request_id TEXT,
    provider TEXT NOT NULL,
    local INTEGER NOT NULL,
    model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_usd REAL,
    baseline_usd REAL,
    baseline_model TEXT,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS requests_ts ON requests(ts);
"""


@dataclass
class LedgerEntry:
    provider: str
    model: str
    local: bool
    usage: Usage
    cost_usd: float | None
    baseline_usd: float | None
    baseline_model: str | None
    reason: str
    request_id: str | None = None
    ts: float | None = None


@dataclass
class CostRow:
    provider: str
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    unpriced: int


@dataclass
class CostReport:
    ledger: str
    since: str | None
    rows: list[CostRow]
    requests: int
    cost_usd: float
    baseline_usd: float | None
    baseline_models: list[str]
    savings_usd: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Ledger:
    """One SQLite file shared by the server (one long-lived writer connection) and the CLI
    (a reader per report). WAL with synchronous=NORMAL: a row costs no fsync of its own (a
    crash may lose the last rows, never corrupt the file) and readers never block writers."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._writer: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=10, check_same_thread=False)
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("PRAGMA journal_mode=WAL")
        con.executescript(SCHEMA)
        return con

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def record(self, e: LedgerEntry) -> None:
        with self._lock:
            if self._writer is None:
                self._writer = self._connect()
            self._write(self._writer, e)

    @staticmethod
    def _write(con: sqlite3.Connection, e: LedgerEntry) -> None:
        with con:
            con.execute(
                "INSERT INTO requests (ts, request_id, provider, local, model, prompt_tokens, "
                "completion_tokens, cost_usd, baseline_usd, baseline_model, reason) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (e.ts or time.time(), e.request_id, e.provider, int(e.local), e.model, e.usage.prompt_tokens,
                 e.usage.completion_tokens, e.cost_usd, e.baseline_usd, e.baseline_model, e.reason))
            faults.point("ledger.commit")

    def report(self, since: float | None = None) -> CostReport:
        since_label = _iso(since) if since is not None else None
        if not self.path.exists():
            return CostReport(str(self.path), since_label, [], 0, 0.0, None, [], None)
        where, args = ("WHERE ts >= ?", (since,)) if since is not None else ("", ())
        with closing(self._connect()) as con:
            rows = [CostRow(p, m, n, pt, ct, round(c or 0.0, 8), u) for p, m, n, pt, ct, c, u in con.execute(
                "SELECT provider, model, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), "
                f"SUM(cost_usd), SUM(cost_usd IS NULL) FROM requests {where} "
                "GROUP BY provider, model ORDER BY SUM(cost_usd) DESC, COUNT(*) DESC", args)]
            n, cost, base, base_cost = con.execute(
                "SELECT COUNT(*), COALESCE(SUM(cost_usd), 0), SUM(baseline_usd), "
                f"SUM(CASE WHEN baseline_usd IS NOT NULL THEN COALESCE(cost_usd, 0) END) FROM requests {where}",
                args).fetchone()
            models = [r[0] for r in con.execute(
                f"SELECT DISTINCT baseline_model FROM requests {where} "
                f"{'AND' if where else 'WHERE'} baseline_model IS NOT NULL", args)]
        savings = round(base - base_cost, 8) if base is not None else None
        return CostReport(str(self.path), since_label, rows, int(n), round(float(cost), 8),
                          round(base, 8) if base is not None else None, models, savings)

    def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        """The latest routing decisions, newest first (what the dashboard lists)."""
        if not self.path.exists():
            return []
        with closing(self._connect()) as con:
            rows = con.execute("SELECT ts, provider, model, local, prompt_tokens, completion_tokens, cost_usd, "
                               "reason FROM requests ORDER BY ts DESC LIMIT ?", (limit,)).fetchall()
        keys = ("ts", "provider", "model", "local", "prompt_tokens", "completion_tokens", "cost_usd", "reason")
        return [{**dict(zip(keys, r)), "local": bool(r[3])} for r in rows]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(value: str, now: float | None = None) -> float:
    """'24h', '7d', '30m', '2w', an ISO date ('2026-11-01') or datetime; naive times are UTC."""
    now = time.time() if now is None else now
    v = value.strip()
    m = _RELATIVE.match(v.lower())
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        dt = datetime.fromisoformat(v)
    except ValueError:
        raise ValueError(f"--since takes 24h, 7d, 30m, 2w or an ISO date like 2026-11-01, got {value!r}") \
            from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
