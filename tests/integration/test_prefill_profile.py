"""benchmarks/prefill_profile.py on a small Q4_K_M-typed GGUF through the streamed import: its
prefill and 16-row decode profiles run for real, count the matrices' work, and show the LM head
at one row in the serving path against every position in the graph as exported. No timing is
asserted (speed lives in the benchmark's JSON)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("gguf")

from tests.integration.test_gguf_stream import Q4_K_M, write
from tests.integration.test_speed_benchmarks import bench

from ortserve.models.gguf.fast import import_gguf_streamed

HEAD = "lm_head MatMulNBits 8-bit block 16 (no zero points)"


def test_prefill_profile_splits_prefill_and_row_decode_time(tmp_path: Path) -> None:
    gguf_file = write(tmp_path / "llama.gguf", "llama", Q4_K_M, embd="Q6_K")
    import_gguf_streamed(gguf_file, tmp_path / "model", smoke=False)
    out = bench("prefill_profile.py", "--gguf", str(gguf_file), "--model", str(tmp_path / "model"),
                "--no-speed", "--tokens", "24", "--rows", "4", "--prompt", "5", "--steps", "3", "--rounds", "1",
                "--threads", "1", tmp_path=tmp_path)
    p = out["profile"]
    last, every, rows = p["prefill_last_logits"], p["prefill_every_logits"], p["decode_4_rows"]
    assert (last["runs"], every["runs"], rows["runs"]) == (1, 1, 3)
    for prof in (last, every, rows):
        kinds = prof["kinds"]
        assert sum(k["share"] for k in kinds.values()) == pytest.approx(1.0, abs=1e-3)
        assert "MatMulNBits 4-bit block 32 (no zero points) + min term" in kinds
        assert kinds["min term: offsets MatMul"]["nodes_per_run"] == 2 * 4     # q, k, o, gate+up x 2 layers
        assert kinds["min term: offsets MatMul"]["gflop_per_run"] > 0
    # the LM head's work: one row in the serving path, every prompt position as exported, a row each here
    assert every["kinds"][HEAD]["gflop_per_run"] == pytest.approx(24 * last["kinds"][HEAD]["gflop_per_run"], rel=0.02)
    assert rows["kinds"][HEAD]["gflop_per_run"] == pytest.approx(4 * last["kinds"][HEAD]["gflop_per_run"], rel=0.02)


def test_scale_measures_the_serving_runner_and_raw_og_apart(tmp_path: Path) -> None:
    """benchmarks/scale.py's ortserve figures come from the Runner (last-position logits, as
    served); onnxruntime-genai's (every position's logits) are kept apart as raw_og."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import scale

    gguf_file = write(tmp_path / "llama.gguf", "llama", Q4_K_M, embd="Q6_K")
    import_gguf_streamed(gguf_file, tmp_path / "model", smoke=False)
    for og in (False, True):
        got = scale.ortserve_speed(tmp_path / "model", 1, og=og, tokens=160)   # the tiny context: 256
        assert set(got) == {"pp512", "tg128", "parallel16_total", "parallel16_decode"} and min(got.values()) > 0
