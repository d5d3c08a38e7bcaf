"""`ortserve telemetry summary`: the numbers match what was recorded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ortserve.cli.telemetry import telemetry_group
from ortserve.errors import InvalidRequest
from ortserve.telemetry import TelemetryConfig
from ortserve.telemetry.otel import FileTelemetry
from ortserve.telemetry.summary import iter_requests, parse_since, percentile, summarize

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """20 chat requests on model a (2 of them 503s), 7 completions on model b (one 400)."""
    directory = tmp_path_factory.mktemp("tel")
    tel = FileTelemetry(TelemetryConfig(directory=directory, metric_interval_s=3600))
    rng = np.random.default_rng(0)
    truth = []
    for i in range(27):
        route, model = (CHAT, "a") if i < 20 else (COMPLETIONS, "b")
        status = 503 if i in (3, 11) else 400 if i == 22 else 200
        ttft = float(rng.uniform(0.005, 0.4))
        with tel.request_span(route, model=model, provider="local", execution_provider="cpu") as span:
            time.sleep(0.001 * (i % 4))
            span.finish(input_tokens=10 + i, output_tokens=i, ttft=ttft, tpot=0.01,
                        finish_reason="stop" if status == 200 else "error", status=status)
        truth.append({"route": route, "model": model, "status": status, "ttft": ttft,
                      "input": 10 + i, "output": i})
    tel.shutdown()
    return directory, truth


def raw_durations_ms(directory: Path, route: str) -> list[float]:
    """Span durations read straight from the files, independently of summary.py."""
    out = []
    for path in directory.glob("traces-*.jsonl"):
        for raw in path.read_text(encoding="utf-8").splitlines():
            for rs in json.loads(raw)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        if sp["name"] == route:
                            out.append((int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])) / 1e6)
    return out


def test_summary_matches_what_was_recorded(recorded: tuple[Path, list[dict]]) -> None:
    directory, truth = recorded
    rows = {(r.route, r.model): r for r in summarize(iter_requests(directory))}
    assert set(rows) == {(CHAT, "a"), (COMPLETIONS, "b"), ("all", "all")}
    for (route, model), row in rows.items():
        mine = [t for t in truth if route == "all" or t["route"] == route]
        assert row.requests == len(mine)
        assert row.errors == sum(t["status"] >= 400 for t in mine)
        assert row.server_errors == sum(t["status"] >= 500 for t in mine)
        assert row.client_errors == sum(400 <= t["status"] < 500 for t in mine)
        assert row.input_tokens == sum(t["input"] for t in mine)
        assert row.output_tokens == sum(t["output"] for t in mine)
        ttfts = [t["ttft"] * 1000 for t in mine]
        for q in (50, 90, 99):
            assert row.ttft_ms[f"p{q}"] == pytest.approx(np.percentile(ttfts, q))
    chat = rows[(CHAT, "a")]
    assert chat.error_rate == pytest.approx(2 / 20)
    durations = raw_durations_ms(directory, CHAT)
    assert chat.total_ms["p90"] == pytest.approx(np.percentile(durations, 90))
    assert min(durations) >= 0 and chat.total_ms["p99"] >= 3  # the 3 ms sleeps are in there


def test_summary_cli_table_and_json(recorded: tuple[Path, list[dict]]) -> None:
    directory, truth = recorded
    runner = CliRunner()
    res = runner.invoke(telemetry_group, ["summary", "--telemetry-dir", str(directory)])
    assert res.exit_code == 0, res.output
    chat_line = next(line for line in res.output.splitlines() if line.startswith(CHAT))
    assert chat_line.split()[1:7] == ["a", "20", "2", "0", "2", "10.0"]

    res = runner.invoke(telemetry_group, ["summary", "--json", "--telemetry-dir", str(directory)])
    data = json.loads(res.output)
    total = next(r for r in data["rows"] if r["route"] == "all")
    assert total["requests"] == len(truth) and total["errors"] == 3


def test_since_filters_by_start_time(recorded: tuple[Path, list[dict]]) -> None:
    directory, truth = recorded
    runner = CliRunner()
    recent = runner.invoke(telemetry_group, ["summary", "--json", "--since", "1h", "--telemetry-dir",
                                             str(directory)])
    assert sum(r["requests"] for r in json.loads(recent.output)["rows"] if r["route"] != "all") == len(truth)
    future = runner.invoke(telemetry_group, ["summary", "--since", "2999-01-01", "--telemetry-dir",
                                             str(directory)])
    assert future.exit_code == 0 and "No requests recorded" in future.output
    bad = runner.invoke(telemetry_group, ["summary", "--since", "yesterday", "--telemetry-dir",
                                          str(directory)])
    assert bad.exit_code == 2 and "30m, 2h, 7d" in bad.output


def test_empty_directory(tmp_path: Path) -> None:
    res = CliRunner().invoke(telemetry_group, ["summary", "--telemetry-dir", str(tmp_path / "none")])
    assert res.exit_code == 0 and "ORTSERVE_TELEMETRY=1" in res.output


def test_parse_since_and_percentile() -> None:
    now = 1_000_000.0
    assert parse_since("30m", now) == now - 1800
    assert parse_since("2h", now) == now - 7200
    assert parse_since("1.5d", now) == now - 1.5 * 86400
    assert parse_since("1970-01-02T00:00:00", now) == 86400
    assert parse_since("1970-01-02T00:00:00+01:00", now) == 86400 - 3600
    with pytest.raises(InvalidRequest):
        parse_since("soon", now)
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    for q in (0, 25, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert percentile([], 50) is None
