"""GGUF imports through the store: exact by default, re-quantized on request or when a block
type has no exact form (with a message saying so)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).parent))

from test_gguf_exact import uniform, write_tiny_gguf

from ortserve.models.importer import import_gguf
from ortserve.models.store import ModelStore


@pytest.mark.parametrize("path", ["builder", "streamed", "native"])
def test_default_gguf_import_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """A small file goes through the builder's graph; one of STREAM_MIN_BYTES or more (here: any)
    through the graph written from its metadata, blocks streamed (test_gguf_stream.py checks it);
    any size on the GGUF-native kernels where they are active (test_gguf_native_import.py)."""
    from ortserve.models import gate_segments
    from ortserve.models.gguf import fast as gguf_fast
    from ortserve.models.gguf.native import plan

    streamed = path != "builder"
    if path == "native" and not plan().use:
        pytest.skip(f"GGUF-native kernels not active: {plan().reason}")
    if path != "native":   # today's MatMulNBits graphs
        monkeypatch.setenv("ORTSERVE_NATIVE", "0")
    if streamed:   # and the gate a layer at a time, with the decode-speed run asked for
        monkeypatch.setattr(gguf_fast, "STREAM_MIN_BYTES", 0)
        monkeypatch.setattr(gate_segments, "BUDGET", 1)
    store = ModelStore(tmp_path / "store")
    said: list[str] = []
    v = import_gguf(store, write_tiny_gguf(tmp_path / "t.gguf", uniform("Q4_1")), "tiny", progress=said.append,
                    speed=streamed)
    assert (v.variant, v.precision) == ("q4_1-cpu", "q4_1")
    exact = v.notes["gguf_exact"]
    assert exact["kernels"] == ("gguf-native" if path == "native" else "matmulnbits")
    if path == "native":   # the file's rows, checked against the MatMulNBits graph's fp32 reference
        assert exact["method"] == "gguf-exact-streamed" and exact["logit_error"]["ok"]
        assert any(m.startswith("native: logits") for m in said), said
    elif streamed:
        assert exact["method"] == "gguf-exact-streamed" and exact["graph_version"] == 3
        assert exact["max_weight_error"] < 1e-6 and exact["checked_tensors"] == 2 * 7 + 1
    else:
        assert exact["max_weight_error"] < 1e-6 and exact["logit_error"]["fp32_compute"] < 2e-3
    assert abs(v.quality["delta_pct"]) < 1.0 and v.quality["reference_perplexity"] > 1
    assert any("GGUF blocks" in m or "GGUF-native graph" in m for m in said)
    assert (v.speed.get("decode_tps", 0) > 0) == streamed   # measured only when asked: it loads the whole model
    assert any(m.startswith("measuring perplexity") and m.endswith("and speed") == streamed for m in said), said
    assert [x.variant for x in store.find("tiny")] == ["q4_1-cpu"]


def test_unsupported_block_type_falls_back_to_requantizing(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    said: list[str] = []
    path = write_tiny_gguf(tmp_path / "iq3.gguf", [{**uniform("Q4_0")[0], "ffn_down": "IQ3_XXS"}])
    v = import_gguf(store, path, "tiny-iq4", progress=said.append)
    assert v.variant == "int8-cpu" and "gguf_exact" not in v.notes
    assert any("IQ3_XXS" in m and "re-quantizing to int8" in m for m in said), said


def test_cli_import_measures_speed_with_the_flag(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from ortserve.cli.main import cli

    path = write_tiny_gguf(tmp_path / "t.gguf", uniform("Q4_0"))
    env = {"ORTSERVE_HOME": str(tmp_path / "home")}
    res = CliRunner().invoke(cli, ["models", "import", str(path), "--id", "fast", "--speed", "--json"], env=env)
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["id"] == "fast:q4_0-cpu" and v["speed"]["decode_tps"] > 0 and v["quality"]["perplexity"] > 1
    listed = CliRunner().invoke(cli, ["models", "list"], env=env).output   # without --speed: test above
    assert f"{v['speed']['decode_tps']:g}" in listed.splitlines()[1].split(), listed   # the TOK/S column
