"""benchmarks/node_costs.py runs for real on the library's ops at a small size and reports each
measurement it promises; no timing is asserted (speed lives in its JSON, docs/native.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.test_speed_benchmarks import bench

from ortserve import native

pytestmark = pytest.mark.skipif(not native.status().active, reason="the native library is not active here")


def test_node_costs_fits_the_matmuls_and_times_each_chain(tmp_path: Path) -> None:
    out = bench("node_costs.py", "--threads", "1", "--total-mb", "2", "--k", "512", "--n", "64", "256",
                "--chain", "3", "--reps", "3", "--positions", "4", "--flush-mb", "1", tmp_path=tmp_path)
    rows = out["matmul"]["rows"]
    assert [r["n"] for r in rows] == [64, 256]
    # 2 MB of 512-wide Q4_K rows (288 bytes each): as many whole nodes as fit, at least one
    assert [r["nodes"] for r in rows] == [2 * 2**20 // (64 * 288), 2 * 2**20 // (256 * 288)]
    assert all(r["us_per_node"] > 0 and r["gb_per_s"] > 0 for r in rows)
    assert set(out["matmul"]["fit"]) == {"fixed_us", "gb_per_s"}
    assert set(out["chain"]["ops"]) == {"Add", "SkipRmsNorm", "SkipSimplifiedLayerNormalization"}
    assert all(c["us_one_node_run"] > 0 for c in out["chain"]["ops"].values())
    # one run warm and one after the flush, for the harness (Add), the norm and the attention at each position
    assert set(out["cold"]["runs"]) == {"Add", "SkipRmsNorm", "GroupQueryAttention@4"}
    assert all(r["warm_us"] > 0 and r["cold_us"] > 0 for r in out["cold"]["runs"].values())


@pytest.mark.parametrize(("args", "says"), [(["--chain", "1"], "--chain must be at least 2"),
                                            (["--positions", "600"], "every --positions in 1..512")])
def test_node_costs_refuses_what_it_cannot_measure(tmp_path: Path, args: list[str], says: str) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "node_costs.py"), *args],
                       capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert r.returncode != 0 and says in r.stderr
