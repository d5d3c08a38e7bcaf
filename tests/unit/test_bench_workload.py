"""Bench bookkeeping with no model: which cells run, how a repetition's figures are computed, ratios."""

from __future__ import annotations

import os

import pytest

from ortserve.bench.measure import PeakRSS, Timing, percentile, summarize_rep
from ortserve.bench.runner import add_stats
from ortserve.bench.workload import Workload


def test_default_workload_is_the_adrs() -> None:
    w = Workload()
    assert (w.prompt_lengths, w.batch_sizes, w.gen_tokens, w.warmup, w.reps) == (
        (16, 64, 256, 1024, 2048), (1, 4, 8, 16), 256, 5, 10)


def test_cells_sweep_grid_and_non_batching_backends() -> None:
    w = Workload(prompt_lengths=(16, 256), batch_sizes=(1, 4, 8))
    assert w.cells(batches=True) == [(1, 16), (1, 256), (4, 16), (8, 16)]
    assert w.cells(batches=False) == [(1, 16), (1, 256)]
    grid = Workload(prompt_lengths=(16, 256), batch_sizes=(1, 4), grid=True)
    assert grid.cells(batches=True) == [(1, 16), (1, 256), (4, 16), (4, 256)]


def test_prompt_lengths_are_capped_by_the_context() -> None:
    w = Workload().capped(2048)
    assert w.prompt_lengths == (16, 64, 256, 1024)  # 2048 + 256 generated tokens do not fit


def test_summarize_rep_of_a_batch() -> None:
    # two requests of 11 tokens: first tokens at 0.1 s and 0.3 s, last tokens at 1.2 s and 1.3 s
    rep = summarize_rep([Timing(0.1, 1.2, 11, 16), Timing(0.3, 1.3, 11, 16)])
    assert rep["ttft"] == pytest.approx(0.2)
    assert rep["latency"] == pytest.approx(1.3)
    assert rep["decode_tps"] == pytest.approx(20 / 1.0)  # tokens after the first, after the last first token
    assert rep["throughput"] == pytest.approx(22 / 1.3)
    assert rep["output_tokens"] == 22 and rep["input_tokens"] == 16


def test_percentile_interpolates_like_numpy() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 90) == pytest.approx(3.7)


def test_speedups_are_against_the_engine_row() -> None:
    def row(name: str, tps: float, latency: float) -> dict:
        rep = {"ttft": 0.1, "decode_tps": tps, "latency": latency, "throughput": tps, "output_tokens": 8.0,
               "input_tokens": 16.0}
        return {"name": name, "status": "ok", "cells": [{"batch": 1, "prompt_length": 16, "reps": [rep, rep]}]}

    results = {"backends": [row("engine", 100.0, 1.0), row("llamacpp", 80.0, 1.25)]}
    add_stats(results)
    speed = results["backends"][1]["cells"][0]["engine_speedup"]
    assert speed["decode_tps"] == pytest.approx(1.25) and speed["latency"] == pytest.approx(1.25)
    assert results["backends"][0]["cells"][0]["engine_speedup"]["decode_tps"] == 1.0


def test_peak_rss_sees_this_process() -> None:
    with PeakRSS(lambda: [os.getpid()]) as rss:
        block = bytearray(64 * 2**20)
        block[::4096] = b"x" * len(block[::4096])
    assert rss.peak > 64 * 2**20
