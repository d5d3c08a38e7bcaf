"""Exact GGUF imports made by an older importer (graph version < GRAPH_VERSION) are noticed
and re-imported once from their GGUF; current ones and ones whose GGUF is gone are kept.

The 74 s real build (gguf_exact.import_gguf_exact + perplexity + speed) is replaced by one
that writes a marked file, and the block-type preflight (17 s under load: it parses the whole
GGUF) by its answer for the embedded file, q4_1: what is under test is the decision, the lock
and the manifest.
The real path is exercised by the default-model fixture on any store imported before v2.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from ortserve.models import importer
from ortserve.models.catalog import DEFAULT_MODEL, embedded_gguf
from ortserve.models.gguf.exact import GRAPH_VERSION
from ortserve.models.store import MANIFEST, ModelStore


@pytest.fixture(autouse=True)
def matmulnbits_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph-version rule alone: with the GGUF-native kernels on, a variant on MatMulNBits is
    also stale (gguf_native_import.kernels_stale; tests/integration/test_gguf_native_import.py)."""
    monkeypatch.setenv("ORTSERVE_NATIVE", "0")


def install_exact(store: ModelStore, graph_version: int | None, source: str | None = None,
                  model: str = DEFAULT_MODEL) -> Path:
    """The default model's exact variant as an importer of ``graph_version`` left it (None:
    the first importer, which wrote no version)."""
    notes: dict[str, Any] = {"method": "gguf-exact", "nodes": 151}
    if graph_version is not None:
        notes["graph_version"] = graph_version

    def build(tmp: Path) -> dict[str, Any]:
        (tmp / "model.onnx").write_bytes(b"graph v1")
        return {"precision": "q4_1", "device": "cpu", "source": source or f"gguf:{embedded_gguf()}",
                "aliases": ["default"], "notes": {"gguf_exact": notes}, "quality": {"perplexity": 22.58}}

    return store.install(model, "q4_1-cpu", build).path


class Builds(list):  # type: ignore[type-arg]
    """The builds made, and what each waits for before it finishes (a test's event; none by default)."""

    def __init__(self) -> None:
        super().__init__()
        self.before_done: Callable[[], object] = lambda: None


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Builds:
    calls = Builds()

    def build_exact(store: ModelStore, gguf: Path, model_id: str, tmp: Path, progress: Any,
                    aliases: list[str] | None, speed: bool) -> dict[str, Any]:
        calls.append({"gguf": gguf, "model": model_id, "aliases": aliases, "speed": speed})
        calls.before_done()
        (tmp / "model.onnx").write_bytes(f"graph v{GRAPH_VERSION}".encode())
        return {"precision": "q4_1", "device": "cpu", "source": f"gguf:{gguf}", "aliases": aliases or [],
                "notes": {"gguf_exact": {"method": "gguf-exact", "graph_version": GRAPH_VERSION}}}

    monkeypatch.setattr(importer, "_build_exact", build_exact)
    monkeypatch.setattr(importer, "_exact_plan", lambda gguf, device, progress: "q4_1")
    return calls


def manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / MANIFEST).read_text(encoding="utf-8"))


@pytest.mark.parametrize("old", [None, 1])
def test_ensure_default_reimports_an_older_exact_graph_once(tmp_path: Path, builds: list[dict[str, Any]],
                                                            old: int | None) -> None:
    store = ModelStore(tmp_path / "models")
    path = install_exact(store, old)
    said: list[str] = []
    v = importer.ensure_default(store, said.append)
    assert len(builds) == 1 and builds[0]["gguf"] == embedded_gguf().resolve() and builds[0]["aliases"] == ["default"]
    assert builds[0]["speed"] is False    # the old manifest had no speed: the re-import measures none either
    assert v.path == path and v.notes["gguf_exact"]["graph_version"] == GRAPH_VERSION
    assert manifest(path)["notes"]["gguf_exact"]["graph_version"] == GRAPH_VERSION
    assert manifest(path)["aliases"] == ["default"]
    assert (path / "model.onnx").read_bytes() == f"graph v{GRAPH_VERSION}".encode()
    assert any("exact-graph version 1" in m and "re-importing" in m for m in said), said
    importer.ensure_default(store, said.append)   # now current: nothing rebuilt
    assert len(builds) == 1


def test_a_current_exact_graph_is_left_alone(tmp_path: Path, builds: list[dict[str, Any]]) -> None:
    store = ModelStore(tmp_path / "models")
    path = install_exact(store, GRAPH_VERSION)
    assert importer.ensure_default(store).path == path
    assert builds == [] and (path / "model.onnx").read_bytes() == b"graph v1"


def test_ensure_default_picks_the_exact_q4_1_variant_over_others(tmp_path: Path, builds: list[dict[str, Any]]) -> None:
    """Manifests say ``q4_1``, the catalog ``Q4_1``: an fp32 variant installed first was
    returned as the default before."""
    store = ModelStore(tmp_path / "models")
    store.install(DEFAULT_MODEL, "fp32-cpu", lambda tmp: (tmp / "model.onnx").write_bytes(b"fp32") and
                  {"precision": "fp32", "device": "cpu"})
    path = install_exact(store, GRAPH_VERSION)
    assert importer.ensure_default(store).path == path


def test_a_stale_graph_whose_gguf_is_gone_is_kept_with_a_message(tmp_path: Path,
                                                                 builds: list[dict[str, Any]]) -> None:
    store = ModelStore(tmp_path / "models")
    gone = tmp_path / "gone.gguf"
    v = store.get(f"other:{install_exact(store, 1, source=f'gguf:{gone}', model='other').name.split('--')[1]}")
    said: list[str] = []
    assert importer.refresh_stale(store, v, said.append) == v
    assert builds == [] and any("is gone" in m for m in said), said


def test_two_callers_upgrade_it_once(tmp_path: Path, builds: Builds, monkeypatch: pytest.MonkeyPatch) -> None:
    """The staleness test runs again under the store lock: the second caller finds v2. The build
    finishes only once the second caller has asked for the lock, so it certainly queues on it."""
    store = ModelStore(tmp_path / "models")
    install_exact(store, 1)
    asked, lock = threading.Semaphore(0), ModelStore.lock

    def counted(self: ModelStore, name: str, timeout: float = 3600.0) -> Any:
        if timeout:  # an install's wait for the lock (a sweep's try, timeout 0, is not one)
            asked.release()
        return lock(self, name, timeout)

    monkeypatch.setattr(ModelStore, "lock", counted)
    builds.before_done = lambda: asked.acquire(timeout=120) and asked.acquire(timeout=120)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(importer.ensure_default(store))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(got) == 2
    assert all(v.notes["gguf_exact"]["graph_version"] == GRAPH_VERSION for v in got)


def test_server_start_and_models_cli_notice_it(tmp_path: Path, builds: list[dict[str, Any]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from ortserve.cli.main import cli
    from ortserve.models.locate import resolve_model_dir

    monkeypatch.setenv("ORTSERVE_HOME", str(tmp_path))
    store = ModelStore(tmp_path / "models")
    path = install_exact(store, 1)
    runner = CliRunner()
    out = runner.invoke(cli, ["models", "list"])
    assert out.exit_code == 0, out.output
    assert "has exact-graph version 1" in out.output and "ortserve models pull smollm2-135m" in out.output
    rows = json.loads(runner.invoke(cli, ["models", "list", "--json"]).output)
    assert "exact-graph version 1" in rows[0]["stale_graph"]
    show = runner.invoke(cli, ["models", "show", "smollm2-135m"])
    assert "graph" in show.output and "exact-graph version 1" in show.output
    assert builds == []   # listing never rebuilds

    said: list[str] = []
    got, _ = resolve_model_dir("default", SimpleNamespace(store_dir=store.root, device="cpu"), said.append)
    assert got == path and len(builds) == 1
    assert manifest(path)["notes"]["gguf_exact"]["graph_version"] == GRAPH_VERSION
    assert "stale_graph" not in json.loads(runner.invoke(cli, ["models", "list", "--json"]).output)[0]
