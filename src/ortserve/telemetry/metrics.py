"""Prometheus metrics for /metrics (one registry per app, so tests can run several apps)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    def __init__(self, stats: Callable[[], Any] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ortserve_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.tokens = Counter("ortserve_tokens", "Tokens processed", ["direction"], registry=r)
        self.ttft = Histogram("ortserve_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("ortserve_time_per_output_token_seconds", "Time per output token",
                              buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0), registry=r)
        self.latency = Histogram("ortserve_request_duration_seconds", "End-to-end generation latency",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Gauge("ortserve_queue_depth", "Requests waiting for a slot", registry=r)
        self.running = Gauge("ortserve_running_requests", "Requests generating", registry=r)
        self.tps = Gauge("ortserve_tokens_per_second", "Decode tokens per second (last 5 s)", registry=r)
        self._stats = stats
        r.register(EngineCollector(lambda: self._stats() if self._stats is not None else None))
        # (wall time, ttft, tpot) of the latest generations: exact percentiles for the dashboard
        self.recent: deque[tuple[float, float | None, float | None]] = deque(maxlen=2048)

    def bind(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def watch_models(self, manager: Any) -> None:
        """Per-model series from the model manager (anything with ps() rows), read at scrape time."""
        self.registry.register(ModelCollector(manager))

    def observe(self, metrics: Any) -> None:
        if metrics is None:
            return
        self.tokens.labels("input").inc(metrics.input_tokens)
        self.tokens.labels("output").inc(metrics.output_tokens)
        if metrics.ttft is not None:
            self.ttft.observe(metrics.ttft)
        if metrics.tpot is not None:
            self.tpot.observe(metrics.tpot)
        self.latency.observe(metrics.total_latency)
        self.recent.append((time.time(), metrics.ttft, metrics.tpot))

    def render(self) -> bytes:
        if self._stats is not None:
            s = self._stats()
            self.queue.set(s.waiting)
            self.running.set(s.running)
            self.tps.set(s.tokens_per_second)
        return generate_latest(self.registry)


class EngineCollector:
    """The engine's own counters (ortserve.types.EngineStats), read at scrape time: prompt tokens
    computed and reused from the prefix cache, the cache's bytes and entries, and its evictions."""

    SERIES = (  # (name, kind, EngineStats field, help)
        ("ortserve_prompt_tokens_computed", "counter", "prompt_tokens_computed",
         "Prompt tokens prefilled (recomputed after preemption included)"),
        ("ortserve_prompt_tokens_cached", "counter", "prompt_tokens_reused",
         "Prompt tokens whose KV was reused from the prefix cache or a running request"),
        ("ortserve_prefix_cache_evictions", "counter", "prefix_cache_evictions",
         "Cached prefixes dropped to make room in the KV budget"),
        ("ortserve_prefix_cache_bytes", "gauge", "prefix_cache_bytes", "KV bytes the prefix cache holds"),
        ("ortserve_prefix_cache_entries", "gauge", "prefix_cache_entries", "Prefixes the prefix cache holds"),
        ("ortserve_speculative_proposed_tokens", "counter", "speculative_proposed",
         "Speculative guesses verified, prompt lookup and draft model (docs/speculative.md)"),
        ("ortserve_speculative_accepted_tokens", "counter", "speculative_accepted",
         "Speculative guesses the model agreed with (tokens decoded for free)"),
        ("ortserve_speculative_draft_proposed_tokens", "counter", "speculative_draft_proposed",
         "Draft-model guesses verified (docs/speculative.md; counted in the proposed total too)"),
        ("ortserve_speculative_draft_accepted_tokens", "counter", "speculative_draft_accepted",
         "Draft-model guesses the model agreed with (counted in the accepted total too)"),
    )

    def __init__(self, stats: Callable[[], Any]) -> None:
        self.stats = stats

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.stats()
        for name, kind, attr, doc in self.SERIES:
            value = getattr(s, attr, None)
            if value is not None:  # engines without a prefix cache (or a fake one) report nothing
                family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                yield family(name, doc, value=float(value))


class ModelCollector:
    """ortserve_model_* series, one label set per model the manager holds."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        rows = self.manager.ps()
        loaded = GaugeMetricFamily("ortserve_model_loaded", "1 when loaded, 0 while loading", labels=["model", "kind"])
        memory = GaugeMetricFamily("ortserve_model_memory_bytes", "Planned memory of the model",
                                   labels=["model"])
        idle = GaugeMetricFamily("ortserve_model_idle_seconds", "Seconds since the model last served",
                                 labels=["model"])
        running = GaugeMetricFamily("ortserve_model_running_requests", "Requests generating", labels=["model"])
        waiting = GaugeMetricFamily("ortserve_model_queue_depth", "Requests waiting", labels=["model"])
        requests = CounterMetricFamily("ortserve_model_requests", "Requests served by the model since it loaded",
                                       labels=["model"])
        for r in rows:
            m = r["model"]
            loaded.add_metric([m, r["kind"]], 1.0 if r["state"] == "loaded" else 0.0)
            memory.add_metric([m], float(r["memory_bytes"]))
            idle.add_metric([m], float(r["idle_seconds"]))
            running.add_metric([m], float(r["running"]))
            waiting.add_metric([m], float(r["waiting"]))
            requests.add_metric([m], float(r["requests"]))
        budget = GaugeMetricFamily("ortserve_models_memory_budget_bytes", "Memory budget for loaded models")
        budget.add_metric([], float(self.manager.budget))
        yield from (loaded, memory, idle, running, waiting, requests, budget)
