"""benchmarks/decode_profile.py on a small Q4_K_M-typed GGUF through the streamed import: the
bytes it says a decode step reads are the MatMulNBits forms' own sizes, and its kernel profile
and A/B run for real. No timing is asserted (speed lives in the benchmark's JSON)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("gguf")

from tests.integration.test_gguf_stream import Q4_K_M, write
from tests.integration.test_speed_benchmarks import bench

from ortserve.models.gguf.fast import import_gguf_streamed

# bytes per weight: the GGUF's blocks, and ortserve's initializers (fp32 scale per block; Q4_K:
# 4-bit codes + fp32 minimum per 32; Q6_K: 8-bit codes, a scale per 16)
FILE = {"Q4_K": 144 / 256, "Q6_K": 210 / 256}
OURS = {"Q4_K": 0.5 + 4 / 32 + 4 / 32, "Q6_K": 1 + 4 / 16}


def test_decode_profile_counts_the_forms_bytes_and_profiles_decode(tmp_path: Path) -> None:
    gguf_file = write(tmp_path / "llama.gguf", "llama", Q4_K_M, embd="Q6_K")
    import_gguf_streamed(gguf_file, tmp_path / "model", smoke=False)
    out = bench("decode_profile.py", "--gguf", str(gguf_file), "--model", str(tmp_path / "model"),
                "--no-speed", "--steps", "4", "--rounds", "1", "--threads", "1",
                "--against", str(tmp_path / "model"), tmp_path=tmp_path)
    b = out["bytes_per_token"]
    for t, g in b["by_gguf_type"].items():
        assert g["ortserve_vs_gguf"] == pytest.approx(OURS[t] / FILE[t], abs=2e-3), t
        assert g["blocksum_indicator"] == 0                          # block sums read no weights
        assert g["mlas_packed_mb"] == pytest.approx(g["ortserve_mb"] + g["scales"], abs=0.02)
    assert b["by_gguf_type"]["Q4_K"]["offsets"] > 0 and b["by_gguf_type"]["Q6_K"]["offsets"] == 0
    assert set(b["by_role"]) == {"attn", "ffn", "lm_head"}
    assert b["by_role"]["lm_head"]["tensors"] == 1                   # the tied Q6_K embedding
    assert b["ortserve_bytes"] > b["llama_cpp_bytes"] > 0
    kinds = out["profile"]["kinds"]
    assert "MatMulNBits 4-bit block 32 (no zero points)" in kinds
    assert "lm_head MatMulNBits 8-bit block 16 (no zero points)" in kinds
    assert kinds["min term: offsets MatMul"]["nodes_per_step"] == 2 * 4   # q, k, o, gate+up (Q4_K) x 2 layers
    assert sum(k["share"] for k in kinds.values()) == pytest.approx(1.0, abs=1e-3)
    assert len(out["a_b"]["a_ms"]) == len(out["a_b"]["b_ms"]) == 1 and out["a_b"]["b_speed_vs_a"] > 0
