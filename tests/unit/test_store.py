"""The store core: ids, atomic installs, locks, verify, links, disk full. No model needed."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
from tests.clocks import wait_until

from ortserve.errors import NotFound, StoreError
from ortserve.models import convert, importer
from ortserve.models.store import MANIFEST, ModelStore, validate_name


def write_files(tmp: Path, payload: bytes = b"weights" * 100) -> dict[str, Any]:
    (tmp / "model.onnx").write_bytes(payload)
    (tmp / "genai_config.json").write_text('{"model": {"type": "llama"}}', encoding="utf-8")
    (tmp / "sub").mkdir()
    (tmp / "sub" / "tokenizer.json").write_text("{}", encoding="utf-8")
    return {"precision": "int8", "device": "cpu"}


@pytest.mark.parametrize("bad", ["..", "../x", "a/b", "a\\b", "/abs", "C:\\x", "", "Upper", "a..b",
                                 ".hidden", "x" * 65, "a b", "a--b"])
def test_bad_ids_are_refused(bad: str) -> None:
    with pytest.raises(StoreError, match="invalid model id"):
        validate_name(bad)


def test_good_ids_pass() -> None:
    for good in ("smollm2-135m", "qwen2-0.5b-instruct", "a", "m_1.2"):
        assert validate_name(good) == good


def test_install_refuses_traversal_ids(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    for model, variant in (("../evil", "int8-cpu"), ("ok", "../../evil"), ("/etc", "x")):
        with pytest.raises(StoreError):
            store.install(model, variant, write_files)
    assert store.variants() == []
    assert not (tmp_path / "evil").exists()


def test_install_registers_manifest_with_hashes(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    v = store.install("m", "int8-cpu", write_files)
    assert set(v.files) == {"model.onnx", "genai_config.json", "sub/tokenizer.json"}
    assert all(len(h) == 64 for h in v.files.values())
    assert v.size_bytes == sum((v.path / f).stat().st_size for f in v.files)
    manifest = json.loads((v.path / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["id"] == "m:int8-cpu" and manifest["files"] == v.files
    assert [x.id for x in store.variants()] == ["m:int8-cpu"]
    assert store.verify(v) == {"corrupt": [], "missing": [], "extra": []}


def test_verify_detects_a_flipped_byte_and_a_missing_file(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    v = store.install("m", "int8-cpu", write_files)
    data = bytearray((v.path / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (v.path / "model.onnx").write_bytes(bytes(data))
    (v.path / "sub" / "tokenizer.json").unlink()
    report = store.verify(store.get("m"))
    assert report["corrupt"] == ["model.onnx"]
    assert report["missing"] == ["sub/tokenizer.json"]


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")

    def boom(tmp: Path) -> dict[str, Any]:
        write_files(tmp)
        raise KeyboardInterrupt  # like Ctrl-C mid-conversion

    with pytest.raises(KeyboardInterrupt):
        store.install("m", "int8-cpu", boom)
    assert store.variants() == []
    assert not any((tmp_path / "models" / ".tmp").iterdir())


def test_disk_full_is_one_clear_error_and_store_unchanged(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    store.install("other", "int8-cpu", write_files)

    def full(tmp: Path) -> dict[str, Any]:
        (tmp / "model.onnx").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(StoreError) as info:
        store.install("m", "int8-cpu", full)
    msg = info.value.one_line()
    assert "disk full" in msg and "ORTSERVE_HOME" in msg and "\n" not in msg
    assert [v.id for v in store.variants()] == ["other:int8-cpu"]
    assert not any((tmp_path / "models" / ".tmp").iterdir())


def test_disk_full_during_hf_conversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The importer path: the builder raises ENOSPC half-way; nothing is registered."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}), encoding="utf-8")
    (hf / "model.safetensors").write_bytes(b"x")
    (hf / "tokenizer.json").write_text("{}", encoding="utf-8")

    def full_build(hf_dir: Path, out: Path, **kw: Any) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.onnx.data").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(convert, "build_onnx", full_build)
    store = ModelStore(tmp_path / "models")
    with pytest.raises(StoreError, match="disk full"):
        importer.import_hf_dir(store, hf, "m", precision="fp32")
    assert store.variants() == []


def test_replace_and_remove(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    store.install("m", "int8-cpu", write_files)
    store.install("m", "fp32-cpu", write_files)
    removed = store.remove("m:int8-cpu")
    assert [v.id for v in removed] == ["m:int8-cpu"]
    assert [v.id for v in store.variants()] == ["m:fp32-cpu"]
    with pytest.raises(NotFound):
        store.remove("nope")


def test_linked_variant_hashes_and_verifies_the_target(tmp_path: Path) -> None:
    target = tmp_path / "outside"
    target.mkdir()
    write_files(target)
    store = ModelStore(tmp_path / "models")
    v = store.install("m", "fp32-cpu", lambda tmp: {"precision": "fp32", "device": "cpu", "link": str(target)})
    assert v.model_dir == target and "model.onnx" in v.files
    assert sorted(p.name for p in v.path.iterdir()) == [MANIFEST]
    (target / "genai_config.json").write_text("changed", encoding="utf-8")
    assert store.verify(store.get("m"))["corrupt"] == ["genai_config.json"]
    store.remove("m")
    assert (target / "model.onnx").is_file()  # rm never deletes linked files


def _install_slowly(root: str, counter: str) -> str:
    log = Path(counter)
    with log.open("a", encoding="utf-8") as f:
        f.write("calling\n")

    def build(tmp: Path) -> dict[str, Any]:
        with log.open("a", encoding="utf-8") as f:
            f.write("built\n")
        # the event, not a sleep: the other process has called install too, so it queues on
        # the lock this build holds (spawning it can take seconds on a loaded machine)
        assert wait_until(lambda: log.read_text(encoding="utf-8").count("calling") == 2)
        return write_files(tmp)

    return ModelStore(Path(root)).install("m", "int8-cpu", build).id


def test_two_processes_install_once(tmp_path: Path) -> None:
    counter = tmp_path / "builds.txt"
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        ids = pool.starmap(_install_slowly, [(str(tmp_path / "models"), str(counter))] * 2)
    assert ids == ["m:int8-cpu", "m:int8-cpu"]
    assert counter.read_text(encoding="utf-8").count("built") == 1


def test_variant_names_encode_builder_options() -> None:
    opts = importer.quant_options(block_size=64, algo="k_quant", last_matmul="int8")
    assert opts == {"block_size": 64, "algo_config": "k_quant", "matmul_mixed_precision": "last_matmul:int8"}
    assert importer.variant_name("int4", "cpu", opts) == "int4-cpu-k_quant-b64-last8"
    assert importer.variant_name("int8", "cuda") == "int8-cuda"
    with pytest.raises(StoreError, match="block size"):
        importer.quant_options(block_size=7)


def test_model_id_from_path() -> None:
    assert importer.model_id_from_path(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "smollm2-135m-instruct.q4_1"
    assert importer.model_id_from_path(Path("/x/Qwen2 0.5B")) == "qwen2-0.5b"
    with pytest.raises(StoreError) as info:
        importer.model_id_from_path(Path("..."))
    assert "--id" in info.value.one_line()


def test_leftovers_of_killed_installs_are_swept_but_not_other_variants_work(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    work = tmp_path / "models" / ".tmp"
    work.mkdir(parents=True)
    mine = ["m--int8-cpu.123.0badc0de", "m--int8-cpu.123.0badc0de.hf", ".m--int8-cpu.123.0badc0de.cache",
            "m--int8-cpu.old.0badc0de"]
    others = ["m--int8-cpu.x.9.0badc0de", "m--int8-cpu-b64.5.0badc0de"]
    for name in mine + others:
        (work / name).mkdir()
    store.install("m", "int8-cpu", write_files)
    assert sorted(p.name for p in work.iterdir()) == sorted(others)
