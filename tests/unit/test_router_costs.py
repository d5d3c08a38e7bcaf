"""Price table, SQLite ledger, `ortserve costs` and `ortserve route explain|check`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_router_config import SEED

from ortserve.cli.route import costs_command, route_group
from ortserve.router.costs import Ledger, LedgerEntry, Price, PriceTable, parse_since
from ortserve.types import Usage


def test_price_table_matches_dated_and_vendor_ids() -> None:
    t = PriceTable({"anthropic": {"my-finetune": Price(input=1, output=2)}})
    assert t.price("anthropic", "claude-3-5-haiku-20241022", False) == Price(input=0.8, output=4.0)
    assert t.price("openrouter", "anthropic/claude-3.5-sonnet", False) == Price(input=3.0, output=15.0)
    assert t.price("openai", "gpt-4o-mini-2024-07-18", False) == Price(input=0.15, output=0.6)
    assert t.price("openai", "gpt-4o", False) == Price(input=2.5, output=10.0)
    assert t.price("anthropic", "my-finetune", False) == Price(input=1, output=2)
    assert t.price("anthropic", "unheard-of", False) is None
    assert t.price("openrouter", "meta-llama/llama-3.3-70b-instruct:free", False) == Price(input=0, output=0)
    assert t.cost("local", "anything", True, Usage(10_000, 10_000)) == 0.0
    # 1000 in at $3/M + 500 out at $15/M
    assert t.cost("anthropic", "claude-sonnet-4-5", False, Usage(1000, 500)) == pytest.approx(0.0105)


def _fill(ledger: Ledger) -> None:
    rows = [("local", "smollm2", True, Usage(100, 50), 0.0, 0.00105, 1000.0),
            ("local", "smollm2", True, Usage(300, 10), 0.0, 0.00105, 2000.0),
            ("anthropic", "claude-sonnet-4-5", False, Usage(1000, 500), 0.0105, 0.0105, 3000.0),
            ("openrouter", "mystery", False, Usage(10, 10), None, 0.00018, 4000.0)]
    for p, m, local, u, cost, base, ts in rows:
        ledger.record(LedgerEntry(p, m, local, u, cost, base, "anthropic:claude-sonnet-4-5", "test", ts=ts))


def test_ledger_totals_and_savings(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "sub" / "costs.sqlite")
    assert ledger.report().requests == 0  # no file yet: empty report, no error
    _fill(ledger)
    r = ledger.report()
    by = {(row.provider, row.model): row for row in r.rows}
    assert r.requests == 4 and by[("local", "smollm2")].requests == 2
    assert by[("local", "smollm2")].prompt_tokens == 400 and by[("local", "smollm2")].completion_tokens == 60
    assert by[("openrouter", "mystery")].unpriced == 1
    assert r.cost_usd == pytest.approx(0.0105)
    assert r.baseline_usd == pytest.approx(0.00105 * 2 + 0.0105 + 0.00018)
    assert r.savings_usd == pytest.approx(r.baseline_usd - 0.0105)
    assert r.baseline_models == ["anthropic:claude-sonnet-4-5"]
    since = ledger.report(2500.0)
    assert since.requests == 2 and since.since == "1970-01-01T00:41:40Z"


def test_parse_since() -> None:
    assert parse_since("24h", now=100_000) == 100_000 - 86_400
    assert parse_since("30m", now=10_000) == 10_000 - 1800
    assert parse_since("2026-11-01") == parse_since("2026-11-01T00:00:00Z")
    with pytest.raises(ValueError, match="--since takes"):
        parse_since("yesterday")


def test_costs_command_text_and_json(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "costs.sqlite")
    _fill(ledger)
    runner = CliRunner()
    out = runner.invoke(costs_command, ["--ledger", str(ledger.path)])
    assert out.exit_code == 0, out.output
    assert re.search(r"anthropic +claude-sonnet-4-5 +1 +1,000 +500 +0.010500", out.output), out.output
    assert "(+1 unpriced)" in out.output
    assert "All on anthropic:claude-sonnet-4-5" in out.output and "saved" in out.output
    js = json.loads(runner.invoke(costs_command, ["--ledger", str(ledger.path), "--json"]).output)
    assert js["requests"] == 4 and js["cost_usd"] == pytest.approx(0.0105)
    bad = runner.invoke(costs_command, ["--ledger", str(ledger.path), "--since", "soon"])
    assert bad.exit_code == 2 and "--since takes" in bad.output


def test_route_explain_and_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "route.json"
    cfg.write_text(json.dumps(SEED), encoding="utf-8")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-cli-secret-0123456789")
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.setenv("ORTSERVE_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    out = runner.invoke(route_group, ["explain", "What is in my diary?", "--privacy", "high", "--local-only",
                                      "--config", str(cfg)])
    assert out.exit_code == 0, out.output
    assert "provider:   onnx" in out.output and "Privacy-sensitive tasks" in out.output
    assert "private:    yes" in out.output
    hard = "Design a distributed database, analyze trade-offs"
    js = json.loads(runner.invoke(route_group, ["explain", hard, "--config", str(cfg), "--json"]).output)
    assert js["provider"] == "anthropic" and js["complexity"] == "high" and js["complexity_estimated"]
    assert any("OPENROUTER_API_KEY" in n for n in js["notes"])
    check = runner.invoke(route_group, ["check", "--config", str(cfg)])
    assert check.exit_code == 0 and "openrouter" in check.output and "not ready" in check.output
    assert "sk-ant-cli-secret" not in check.output + out.output
    broken = tmp_path / "broken.toml"
    broken.write_text('defaultProvider = "gemini"\n', encoding="utf-8")
    bad = runner.invoke(route_group, ["check", "--config", str(broken)])
    assert bad.exit_code == 1 and "defaultProvider: unknown provider 'gemini'" in bad.output
    # no config at all: everything local
    monkeypatch.delenv("ORTSERVE_ROUTER_CONFIG", raising=False)
    local = runner.invoke(route_group, ["explain", "hello", "--json"])
    assert json.loads(local.output)["chain"][0].startswith("local:")
