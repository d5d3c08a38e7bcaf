"""The model store end to end, through the CLI in subprocesses, on the tiny model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from ortserve.models.store import ModelStore


def cli(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORTSERVE_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "ortserve.cli.models", *args], env=env, check=False,
                          capture_output=True, text=True, timeout=timeout, encoding="utf-8", errors="replace")


def ok_json(p: subprocess.CompletedProcess[str]) -> Any:
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_import_hf_dir_then_convert_with_builder_options(tiny_hf_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    v = ok_json(cli(home, "import", str(tiny_hf_dir), "--id", "tiny", "--json"))
    assert v["id"] == "tiny:int8-cpu" and v["source"] == f"hf:{tiny_hf_dir.resolve()}"
    assert v["architecture"] == "llama" and v["context_length"] == 2048
    q = v["quality"]
    assert q["perplexity"] > 1 and q["reference_perplexity"] > 1
    assert q["delta_pct"] == pytest.approx(100 * (q["perplexity"] / q["reference_perplexity"] - 1), abs=0.01)
    assert v["speed"]["decode_tps"] > 0
    assert {"genai_config.json", "model.onnx", "tokenizer.json"} <= set(v["files"])

    c = ok_json(cli(home, "convert", "tiny", "--precision", "int4", "--algo", "k_quant",
                    "--last-matmul", "int8", "--block-size", "16", "--json"))
    assert c["id"] == "tiny:int4-cpu-k_quant-b16-last8"
    assert c["notes"]["builder_options"] == {"algo_config": "k_quant", "block_size": 16,
                                             "matmul_mixed_precision": "last_matmul:int8"}
    assert c["quality"]["reference_perplexity"] == q["reference_perplexity"]  # reused, not rebuilt
    assert c["size_bytes"] < v["size_bytes"]

    shown = ok_json(cli(home, "show", "tiny", "--json"))
    assert {x["id"] for x in shown["variants"]} == {"tiny:int8-cpu", "tiny:int4-cpu-k_quant-b16-last8"}
    assert shown["selection"]["cpu"]["id"] in {"tiny:int8-cpu", "tiny:int4-cpu-k_quant-b16-last8"}
    assert "fp32 perplexity" in shown["selection"]["cpu"]["reason"]
    listed = ok_json(cli(home, "list", "--json"))
    assert len(listed) == 2


def test_import_onnx_dir_copied_and_linked(tiny_model: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    copied = ok_json(cli(home, "import", str(tiny_model), "--id", "tinyonnx", "--json"))
    assert copied["id"] == "tinyonnx:fp32-cpu" and copied["link"] == ""
    assert Path(copied["path"], "model.onnx").is_file()
    assert copied["quality"]["perplexity"] > 1
    linked = ok_json(cli(home, "import", str(tiny_model), "--id", "tinylink", "--link", "--json"))
    assert linked["link"] == str(tiny_model.resolve())
    assert sorted(p.name for p in Path(linked["path"]).iterdir()) == ["ortserve.json"]
    assert ok_json(cli(home, "verify", "tinylink", "--json"))["tinylink:fp32-cpu"]["ok"]

    # flip one byte of the copied weights: verify names the file, exits 1
    onnx_file = Path(copied["path"]) / "model.onnx"
    data = bytearray(onnx_file.read_bytes())
    data[len(data) // 3] ^= 0x10
    onnx_file.write_bytes(bytes(data))
    p = cli(home, "verify", "tinyonnx", "--json")
    assert p.returncode == 1
    assert json.loads(p.stdout)["tinyonnx:fp32-cpu"]["corrupt"] == ["model.onnx"]
    assert p.stderr.startswith("error: tinyonnx has corrupt or missing files")

    # an ONNX-only model cannot be converted: say so
    p = cli(home, "convert", "tinyonnx", "--precision", "int4")
    assert p.returncode == 2 and "imported as ONNX files only" in p.stderr

    removed = ok_json(cli(home, "rm", "tinylink", "--json"))
    assert removed == ["tinylink:fp32-cpu"] and (tiny_model / "model.onnx").is_file()


def test_the_tool_format_is_chosen_at_import_shown_and_changed(tiny_model: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    v = ok_json(cli(home, "import", str(tiny_model), "--id", "tinytools", "--tool-format", "mistral", "--json"))
    assert v["tool_format"] == "mistral"
    shown = ok_json(cli(home, "show", "tinytools", "--json"))["variants"][0]
    assert shown["tool_calls"] == {"tool_format": "mistral", "source": "manifest"}
    assert ok_json(cli(home, "tool-format", "tinytools", "llama3_json", "--json")) == {
        "tinytools:fp32-cpu": {"tool_format": "llama3_json", "source": "manifest"}}
    from ortserve.engine.tokenizer import TextCodec

    assert TextCodec(Path(v["path"])).tool_format.name == "llama3_json"  # what the engine will load
    detected = ok_json(cli(home, "tool-format", "tinytools", "auto", "--json"))["tinytools:fp32-cpu"]
    assert detected["source"] != "manifest" and detected["tool_format"] in ("hermes", "llama3_json", "mistral")
    p = cli(home, "tool-format", "tinytools", "xml")
    assert p.returncode == 2 and "must be one of hermes" in p.stderr and "'xml'" in p.stderr, p.stderr
    p = cli(home, "import", str(tiny_model), "--id", "tinylinked", "--link", "--tool-format", "phi4")
    assert p.returncode == 2 and "drop --link" in p.stderr, p.stderr
    assert "tinylinked" not in cli(home, "list").stdout  # refused before anything was installed


def test_bad_directories_and_files_leave_the_store_unchanged(tiny_model: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    no_cfg = tmp_path / "no-config"
    shutil.copytree(tiny_model, no_cfg)
    (no_cfg / "genai_config.json").unlink()
    p = cli(home, "import", str(no_cfg))
    assert p.returncode == 1 and "no genai_config.json" in p.stderr and len(p.stderr.splitlines()) == 1

    from ortserve.models.catalog import embedded_gguf

    truncated = tmp_path / "truncated.gguf"
    with Path(embedded_gguf()).open("rb") as f:
        truncated.write_bytes(f.read(3_000_000))
    p = cli(home, "import", str(truncated))
    assert p.returncode == 1 and "truncated or corrupt" in p.stderr and "Traceback" not in p.stderr
    assert not ModelStore(home / "models").variants()


def _count_builds_and_import(hf: str, home: str, counter: str) -> str:
    return f"""
import sys
from pathlib import Path
from ortserve.models import convert, importer
from ortserve.models.store import ModelStore
real = convert.build_onnx
def counting(*a, **kw):
    with open({counter!r}, "a", encoding="utf-8") as f:
        f.write("build\\n")
    return real(*a, **kw)
convert.build_onnx = counting
v = importer.import_path(ModelStore(Path({home!r})), Path({hf!r}), model_id="tiny", precision="fp32")
print(v.id, v.created)
"""


def test_two_parallel_imports_convert_once(tiny_hf_dir: Path, tmp_path: Path) -> None:
    home, counter = tmp_path / "home" / "models", tmp_path / "builds.txt"
    code = _count_builds_and_import(str(tiny_hf_dir), str(home), str(counter))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, encoding="utf-8", errors="replace") for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    assert outs[0][0] == outs[1][0]  # same variant, same creation time: one install
    assert counter.read_text(encoding="utf-8").count("build") == 1
    assert [v.id for v in ModelStore(home).variants()] == ["tiny:fp32-cpu"]


def test_killed_import_leaves_nothing_and_the_next_run_redoes_it(tiny_hf_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "ORTSERVE_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "ortserve.cli.models", "import", str(tiny_hf_dir),
                             "--id", "tiny"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    # event, not a timer: wait until the CLI has started the builder child (mid-conversion)
    cli_proc = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    builders: list[psutil.Process] = []
    while time.monotonic() < deadline and proc.poll() is None and not builders:
        builders = [c for c in cli_proc.children() if "ortserve.models.builder_child" in " ".join(c.cmdline())]
        time.sleep(0.05)
    assert builders and proc.poll() is None, "import finished before it could be killed"
    proc.kill()  # only the CLI: the builder runs in its own session and must die with its parent
    proc.wait()
    _, alive = psutil.wait_procs(builders, timeout=30)
    assert not alive, "the builder outlived its killed parent"
    work = home / "models" / ".tmp"
    store = ModelStore(home / "models")
    assert store.variants() == []
    assert ok_json(cli(home, "list", "--json")) == []

    again = ok_json(cli(home, "import", str(tiny_hf_dir), "--id", "tiny", "--json"))
    assert again["id"] == "tiny:int8-cpu"
    assert [p.name for p in work.iterdir()] == []  # the killed run's leftovers were swept
    assert store.verify(store.get("tiny"))["corrupt"] == []


@pytest.mark.default_model
def test_import_the_embedded_gguf(tmp_path: Path) -> None:
    """The real GGUF path (dequantize -> HF -> ONNX), at fp32 so it is its own reference (~1 min)."""
    from ortserve.models.catalog import embedded_gguf

    home = tmp_path / "home"
    v = ok_json(cli(home, "import", str(embedded_gguf()), "--precision", "fp32", "--json"))
    assert v["id"] == "smollm2-135m-instruct.q4_1:fp32-cpu"
    assert v["source"] == f"gguf:{embedded_gguf().resolve()}"
    assert v["architecture"] == "llama" and v["context_length"] > 0
    assert 5 < v["quality"]["perplexity"] < 100 and v["quality"]["delta_pct"] == 0.0
    assert v["speed"]["decode_tps"] > 0
    assert ok_json(cli(home, "verify", "smollm2-135m-instruct.q4_1", "--json"))[v["id"]]["ok"]
