"""The prefix cache's Prometheus series come from EngineStats at scrape time."""

from __future__ import annotations

from types import SimpleNamespace

from ortserve.telemetry.metrics import ServerMetrics
from ortserve.types import EngineStats, Metrics


def series(text: str) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith(("ortserve_prompt_tokens", "ortserve_prefix_cache"))}


def test_counters_follow_the_engine_stats() -> None:
    stats = EngineStats(running=1, waiting=0, tokens_per_second=0.0, total_requests=2, total_output_tokens=9,
                        prompt_tokens_computed=1540, prompt_tokens_reused=0)
    m = ServerMetrics(lambda: stats)
    assert series(m.render().decode()) == {
        "ortserve_prompt_tokens_computed_total": 1540.0, "ortserve_prompt_tokens_cached_total": 0.0,
        "ortserve_prefix_cache_evictions_total": 0.0, "ortserve_prefix_cache_bytes": 0.0,
        "ortserve_prefix_cache_entries": 0.0}
    stats.prompt_tokens_computed, stats.prompt_tokens_reused = 1600, 1540
    stats.prefix_cache_bytes, stats.prefix_cache_entries, stats.prefix_cache_evictions = 70 << 20, 1, 3
    got = series(m.render().decode())
    assert got["ortserve_prompt_tokens_cached_total"] == 1540.0
    assert got["ortserve_prefix_cache_bytes"] == float(70 << 20) and got["ortserve_prefix_cache_evictions_total"] == 3


def test_an_engine_without_the_fields_reports_none_of_them() -> None:
    m = ServerMetrics(lambda: SimpleNamespace(running=0, waiting=0, tokens_per_second=0.0))
    assert series(m.render().decode()) == {}
    assert series(ServerMetrics().render().decode()) == {}  # nothing bound yet


def test_metrics_carry_cached_tokens() -> None:
    assert Metrics(model="m", input_tokens=100, cached_tokens=64).to_dict()["cached_tokens"] == 64
    assert Metrics(model="m").cached_tokens == 0
