"""The default model's weights in transparent huge pages (issue 22): the greedy tokens do not
change, and the prepacked weights are what gets advised."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ortserve.engine.huge_pages import file_mappings, thp_enabled
from ortserve.engine.runner import ModelSpec, Runner


def _greedy(runner: Runner, ids: list[int], n: int) -> list[int]:
    tok = int(np.argmax(runner.prefill(0, ids)))
    out = [tok]
    for _ in range(n - 1):
        tok = int(np.argmax(runner.decode(np.array([tok], dtype=np.int64))[0]))
        out.append(tok)
    runner.clear(0)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux") or not thp_enabled(), reason="no transparent huge pages here")
def test_default_model_weights_in_huge_pages_give_the_same_greedy_tokens(default_model: Path) -> None:
    """In a fresh process, as a server loads its model: in a long-lived one (this test run) malloc
    reuses memory that earlier tests freed, and fewer of the weights land in new mappings."""
    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import test_huge_pages_runner as t; print(json.dumps(t.measure({str(default_model)!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["plain_bytes"] == 0
    assert got["huge_tokens"] == got["plain_tokens"]
    # the prepacked 4-bit weights, minimum terms and 8-bit LM head are ~110 MB; the GGUF-native
    # graph (docs/native.md) reads the file's ~96 MB of blocks in place: read into huge pages and
    # handed to the session, instead of onnxruntime's 4 KB mapping of model.onnx.data
    assert got["huge_bytes"] > 64 << 20, got
    if _native(default_model):
        assert got["plain_file_mapped"] > 64 << 20, got  # the plain side: as onnxruntime maps it
        assert got["file_mapped_after"] < 8 << 20, got   # the huge side: only what the ops do not read


def _native(model: Path) -> bool:
    config = json.loads((model / "genai_config.json").read_text(encoding="utf-8"))
    return bool(config["model"]["decoder"].get("session_options", {}).get("custom_ops_library"))


def measure(model: str) -> dict[str, object]:
    spec = ModelSpec.read(Path(model))
    plain = Runner(spec, slots=1, huge_pages=False)
    plain_mapped = file_mappings(spec.onnx_path.parent)
    huge = Runner(spec, slots=1)
    left = set(file_mappings(spec.onnx_path.parent)) - set(plain_mapped)
    ids = list(range(200, 240))
    return {"plain_bytes": plain.huge_page_bytes, "huge_bytes": huge.huge_page_bytes,
            "plain_file_mapped": sum(b - a for a, b in plain_mapped), "file_mapped_after": sum(b - a for a, b in left),
            "huge_tokens": _greedy(huge, ids, 24), "plain_tokens": _greedy(plain, ids, 24)}
