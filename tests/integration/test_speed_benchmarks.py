"""The speed benchmarks run for real on the tiny model and check what they claim.

No timing is asserted (speed lives in the benchmarks' JSON); these tests hold the
correctness the numbers rest on: the engine's greedy tokens equal a bare session.run +
argmax loop over the same Runner, and vs_llamacpp reports a missing llama.cpp as skipped
with the way to build it instead of failing or inventing figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench(script: str, *args: str, tmp_path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ORTSERVE_HOME": str(tmp_path / "home")}
    env.pop("LLAMA_CPP_BIN", None)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                       timeout=300, check=False, env=env, cwd=tmp_path, encoding="utf-8", errors="replace")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_engine_overhead_phases_and_same_greedy_tokens(tiny_model: Path, tmp_path: Path) -> None:
    out = bench("engine_overhead.py", "--model", str(tiny_model), "--gen", "12", "--reps", "2", "--no-og",
                tmp_path=tmp_path)
    assert out["same_greedy_tokens"] is True
    phases = out["instrumented_engine"]
    assert phases["steps"] == 11      # 12 tokens: one from prefill, 11 decode steps
    assert set(phases["us_per_step"]) == {"session_run", "sample", "accept", "emit", "rest"}
    assert phases["us_per_step"]["session_run"] > 0
    assert phases["us_per_step"]["sample"] > 0  # the timer wraps the sample() the step calls (engine/postprocess.py)
    assert abs(sum(phases["share"].values()) - 1) < 0.01
    assert len([x for x in out["decode_tps"]["runner"].values() if x > 0]) == 3


def test_vs_llamacpp_without_llamacpp_is_skipped_with_the_way_to_build(tiny_model: Path, tmp_path: Path) -> None:
    out = bench("vs_llamacpp.py", "--model", str(tiny_model), "--reps", "1", "--gen", "6", "--prompt", "16",
                "--parallel", "1,2", "--ppl-ctx", "32", "--llama-bin", str(tmp_path / "no-such-dir"),
                tmp_path=tmp_path)
    assert "llama-bench" in out["llamacpp"]["skipped"] and "docs/bench.md" in out["llamacpp"]["skipped"]
    assert not any(k.startswith("llamacpp") for k in out["tokens_per_second"])
    assert set(out["ratios_ortserve_over_reference"]) == {"engine_vs_og_tg"}
    assert out["tokens_per_second"]["ortserve_parallel2"]["median"] > 0
    assert out["perplexity"]["ortserve"] > 1 and "llamacpp" not in out["perplexity"]


def test_mixed_step_graph_is_exact(tiny_model: Path, tmp_path: Path) -> None:
    """The mixed decode+chunk graph (issue 18's piggy-back measurement) gives the same logits and
    KV cache as a decode call followed by a chunk call."""
    out = bench("mixed_step.py", "--model", str(tiny_model), "--rows", "3", "--prompt", "64", "--at", "24",
                "--chunks", "5,16", "--reps", "1", tmp_path=tmp_path)
    assert out["exact"] == {"decode_logits_max_diff": 0.0, "chunk_logits_max_diff": 0.0, "kv_max_diff": 0.0}
    assert [r["chunk"] for r in out["by_chunk"]] == [5, 16]
    assert all(r["mixed_ms"] > 0 and r["separate_ms"] > 0 for r in out["by_chunk"])
