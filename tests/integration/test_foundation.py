"""The foundation: the converter builds a working tiny model; the default model imports once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_tiny_model_has_the_pieces(tiny_model: Path) -> None:
    for name in ("genai_config.json", "model.onnx", "tokenizer.json", "chat_template.jinja"):
        assert (tiny_model / name).is_file(), name
    cfg = json.loads((tiny_model / "genai_config.json").read_text(encoding="utf-8"))
    assert cfg["model"]["decoder"]["num_hidden_layers"] == 2
    assert cfg["model"]["decoder"]["hidden_size"] == 64


def test_default_model_is_imported_with_quality(default_model: Path) -> None:
    manifest = json.loads((default_model / "ortserve.json").read_text(encoding="utf-8"))
    assert manifest["model"] == "smollm2-135m"
    q = manifest["quality"]
    assert q["perplexity"] > 1 and q["reference_perplexity"] > 1
    # the default variant is chosen to stay within 1% of the fp32 reference
    assert abs(q["delta_pct"]) < 1.0, q


def test_serving_import_leaves_torch_out() -> None:
    code = "import sys, ortserve.server, ortserve.engine; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_second_run_reuses_the_stored_model(default_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ortserve.config import load_settings
    from ortserve.models import convert, importer
    from ortserve.models.locate import resolve_model_dir

    def no_conversion(*_a: object, **_k: object) -> None:
        raise AssertionError("the second run imported or converted the default model again")

    # What "reused" means, checked directly rather than by a wall-clock bound (not on a loaded machine)
    for module, name in ((importer, "ensure_default"), (importer, "convert_model"), (importer, "import_gguf"),
                         (convert, "build_onnx")):
        monkeypatch.setattr(module, name, no_conversion)
    created = json.loads((default_model / "ortserve.json").read_text(encoding="utf-8"))["created"]
    path, model_id = resolve_model_dir(None, load_settings())
    variant = json.loads((default_model / "ortserve.json").read_text(encoding="utf-8"))["variant"]
    assert path == default_model and model_id == f"smollm2-135m:{variant}"
    assert json.loads((default_model / "ortserve.json").read_text(encoding="utf-8"))["created"] == created
