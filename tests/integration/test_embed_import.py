"""Embedding models in the store: kind recorded and shown, ready ONNX folders importable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from ortserve.cli.main import cli
from ortserve.models.importer import import_path
from ortserve.models.store import ModelStore


def test_default_embedding_manifest_has_kind_and_quality(embedding_model: Path) -> None:
    m = json.loads((embedding_model / "ortserve.json").read_text())
    assert m["kind"] == "embedding" and m["notes"]["embedding"]["dimensions"] == 384
    assert m["quality"]["cosine_min"] >= 0.99 and m["quality"]["sentences"] >= 50
    assert m["speed"]["sentences_per_s"] > 0


def test_ready_onnx_folder_imports_and_lists_as_embedding(embedding_model: Path, tmp_path: Path,
                                                          monkeypatch) -> None:
    src = tmp_path / "my-embedder"
    shutil.copytree(embedding_model, src)
    (src / "ortserve.json").unlink()
    store = ModelStore(tmp_path / "home" / "models")
    v = import_path(store, src, model_id="my-embedder")
    assert v.kind == "embedding" and v.variant == f"{v.precision}-cpu"
    monkeypatch.setenv("ORTSERVE_HOME", str(tmp_path / "home"))
    out = CliRunner().invoke(cli, ["models", "list"]).output
    assert "my-embedder" in out and "embedding" in out
    shown = CliRunner().invoke(cli, ["models", "show", "my-embedder"]).output
    assert "384 dims, mean pooling" in shown


def test_chat_store_entries_default_to_kind_chat(tmp_path: Path) -> None:
    d = tmp_path / "models" / "m--int8-cpu"
    d.mkdir(parents=True)
    (d / "ortserve.json").write_text(json.dumps({"model": "m", "variant": "int8-cpu", "precision": "int8",
                                                 "device": "cpu"}))
    assert ModelStore(tmp_path / "models").get("m").kind == "chat"
