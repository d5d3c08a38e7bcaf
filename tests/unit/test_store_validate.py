"""Untrusted input checks: GGUF bounds, ONNX external-data traversal, directory shape."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from ortserve.errors import ModelError
from ortserve.models.importer import import_path
from ortserve.models.store import ModelStore
from ortserve.models.validate import check_gguf, check_hf_dir, check_onnx_dir


def write_gguf(path: Path, arch: str = "llama") -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(256)
    w.add_tensor("token_embd.weight", np.arange(4 * 64, dtype=np.float32).reshape(4, 64))
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_well_formed_gguf_passes(tmp_path: Path) -> None:
    facts = check_gguf(write_gguf(tmp_path / "ok.gguf"))
    assert facts["architecture"] == "LlamaForCausalLM"
    assert facts["tensors"] == 2 and facts["context_length"] == 256


def test_truncated_gguf_is_refused_at_every_cut(tmp_path: Path) -> None:
    data = write_gguf(tmp_path / "ok.gguf").read_bytes()
    for cut in (3, 20, 40, 100, len(data) // 2, len(data) - 1):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(ModelError) as info:
            check_gguf(p)
        assert ("truncated" in info.value.message or "not a GGUF" in info.value.message), cut


def test_gguf_lengths_are_bounds_checked(tmp_path: Path) -> None:
    # one metadata key claiming 2**60 bytes: must fail on the bound, not try to allocate
    p = tmp_path / "huge.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2 ** 60) + b"x" * 64)
    with pytest.raises(ModelError, match="truncated or corrupt"):
        check_gguf(p)
    # a tensor table claiming 2**40 tensors
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2 ** 40, 0) + b"\0" * 64)
    with pytest.raises(ModelError, match="truncated or corrupt"):
        check_gguf(p)


def test_gguf_tensor_offsets_past_the_end_are_refused(tmp_path: Path) -> None:
    data = bytearray(write_gguf(tmp_path / "ok.gguf").read_bytes())
    name = b"output_norm.weight"
    # tensor info: name, n_dims(u32), dims(u64), type(u32), offset(u64): bump the offset
    at = data.index(name) + len(name) + 4 + 8 + 4
    data[at:at + 8] = struct.pack("<Q", 1 << 20)
    p = tmp_path / "badoffset.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"output_norm\.weight"):
        check_gguf(p)


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as info:
        check_gguf(write_gguf(tmp_path / "bert.gguf", arch="bert"))
    assert "unsupported architecture 'bert'" in info.value.message
    assert "llama" in (info.value.hint or "")


def test_hf_dir_checks(tmp_path: Path) -> None:
    d = tmp_path / "hf"
    d.mkdir()
    with pytest.raises(ModelError, match=r"no config\.json"):
        check_hf_dir(d)
    (d / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}), encoding="utf-8")
    with pytest.raises(ModelError, match="unsupported architecture 'BertModel'"):
        check_hf_dir(d)
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}), encoding="utf-8")
    with pytest.raises(ModelError, match="no weights"):
        check_hf_dir(d)
    (d / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelError, match="no tokenizer"):
        check_hf_dir(d)
    (d / "tokenizer.json").write_text("{}", encoding="utf-8")
    assert check_hf_dir(d)["architecture"] == "Qwen2ForCausalLM"


def onnx_dir(root: Path, location: str | None = None, filename: str = "model.onnx") -> Path:
    """A minimal ONNX GenAI-shaped dir; ``location`` makes the one weight external."""
    import onnx
    from onnx import TensorProto, helper

    root.mkdir(parents=True, exist_ok=True)
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    if location is not None:
        w.ClearField("float_data")
        w.data_location = TensorProto.EXTERNAL
        entry = w.external_data.add()
        entry.key, entry.value = "location", location
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    onnx.save(helper.make_model(graph), str(root / "model.onnx"))
    cfg = {"model": {"type": "llama", "context_length": 128, "decoder": {"filename": filename}}}
    (root / "genai_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    (root / "tokenizer.json").write_text("{}", encoding="utf-8")
    return root


def test_onnx_dir_ok_and_external_data_inside_is_fine(tmp_path: Path) -> None:
    assert check_onnx_dir(onnx_dir(tmp_path / "plain"))["precision"] == "fp32"
    d = onnx_dir(tmp_path / "ext", location="model.onnx.data")
    (d / "model.onnx.data").write_bytes(np.array([1.0, 2.0], dtype=np.float32).tobytes())
    facts = check_onnx_dir(d)
    assert facts["architecture"] == "llama" and facts["device"] == "cpu"


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_escaping_the_dir_is_refused(tmp_path: Path, location: str) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 8)
    d = onnx_dir(tmp_path / "evil", location=location)
    with pytest.raises(ModelError, match="outside the model directory"):
        check_onnx_dir(d)
    store = ModelStore(tmp_path / "models")
    with pytest.raises(ModelError):
        import_path(store, d, model_id="evil")
    assert store.variants() == []


def test_config_filename_and_symlinks_escaping_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="outside the model directory"):
        check_onnx_dir(onnx_dir(tmp_path / "a", filename="../model.onnx"))
    (tmp_path / "secret.txt").write_text("s", encoding="utf-8")
    d = onnx_dir(tmp_path / "b")
    Path(d / "vocab.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ModelError, match="link to outside"):
        check_onnx_dir(d)


def test_onnx_dir_missing_pieces_are_named(tmp_path: Path) -> None:
    d = onnx_dir(tmp_path / "m")
    (d / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match=r"no tokenizer\.json"):
        check_onnx_dir(d)
    (d / "genai_config.json").unlink()
    with pytest.raises(ModelError, match=r"no genai_config\.json"):
        check_onnx_dir(d)
    d2 = onnx_dir(tmp_path / "m2")
    (d2 / "model.onnx").unlink()
    with pytest.raises(ModelError, match=r"no model\.onnx"):
        check_onnx_dir(d2)
