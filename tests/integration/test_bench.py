"""`ortserve bench --quick` on the tiny model: the backends that need nothing extra run, the rest are
reported as skipped with the command that fixes them, and every figure written is a positive number."""

from __future__ import annotations

import json
import math
from pathlib import Path

from click.testing import CliRunner

from ortserve.cli.main import cli

RUN = ("engine", "server", "og")


def test_bench_quick_writes_json_markdown_and_charts(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    args = ["bench", "--model", str(tiny_model), "--quick", "--out", str(out),
            "--backends", "engine,server,og,llamacpp,transformers,optimum",
            "--optimum-venv", str(tmp_path / "no-optimum-venv"), "--no-setup-optimum"]
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output

    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    rows = {r["name"]: r for r in data["backends"]}
    assert list(rows) == ["engine", "server", "og", "llamacpp", "transformers", "optimum"]
    w = data["workload"]
    for name in RUN:
        row = rows[name]
        assert row["status"] == "ok", row
        assert [(c["batch"], c["prompt_length"]) for c in row["cells"]] == [(1, 16), (4, 16)]
        for cell in row["cells"]:
            assert "error" not in cell, cell
            assert len(cell["reps"]) == w["reps"] == 2
            for rep in cell["reps"]:
                for key in ("ttft", "latency", "decode_tps", "throughput"):
                    assert math.isfinite(rep[key]) and rep[key] > 0, (name, key, rep)
                # greedy with EOS ignored: exactly gen_tokens per request, batch x gen in all
                assert rep["output_tokens"] == cell["batch"] * w["gen_tokens"]
                assert rep["input_tokens"] == 16
                assert rep["ttft"] <= rep["latency"]
            for stat in cell["stats"].values():
                assert stat["median"] > 0 and stat["p90"] >= stat["median"] * 0.999
            assert cell["peak_rss"] > 10 * 2**20
            assert cell["engine_speedup"]["decode_tps"] > 0
        q = row["quality"]
        assert q["perplexity"] > 1 and q["tokens"] > 100
    # The ONNX backends score the same model on the same text: one perplexity.
    assert len({round(rows[n]["quality"]["perplexity"], 6) for n in RUN}) == 1
    assert rows["engine"]["cells"][0]["engine_speedup"]["decode_tps"] == 1.0

    # Skipped backends are listed, each with why and the command that makes it run.
    for name in ("llamacpp", "transformers", "optimum"):
        row = rows[name]
        assert row["status"] == "skipped", row
        assert row["reason"] and row["fix"], row
    assert "optimum-onnx" in rows["optimum"]["fix"] and "-m venv" in rows["optimum"]["fix"]
    # whichever is missing first: the package (a clean CI venv) or a GGUF for the tiny model
    assert rows["llamacpp"]["fix"] in ("ortserve bench --gguf PATH", "pip install llama-cpp-python")
    assert "--hf-dir" in rows["transformers"]["fix"]

    md = (out / "results.md").read_text(encoding="utf-8")
    assert "Decode throughput" in md and "engine/og" in md and "ortserve server (HTTP)" in md
    assert rows["optimum"]["fix"] in md
    assert "ortserve bench --model" in md  # the command that reproduces the tables
    for png in ("tokens_per_second_vs_prompt.png", "latency_vs_prompt.png", "throughput_vs_batch.png"):
        data_png = (out / png).read_bytes()
        assert data_png[:8] == b"\x89PNG\r\n\x1a\n" and len(data_png) > 5000, png
    assert "skipped" in res.output and "wrote" in res.output
