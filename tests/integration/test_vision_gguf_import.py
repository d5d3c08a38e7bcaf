"""`ortserve models import text.gguf --mmproj mmproj.gguf` (issue 42): a Qwen2.5-VL as llama.cpp keeps
it, two GGUFs made by llama.cpp's own converter from the random test model, imported as a vision model
that answers as the same weights imported from their Hugging Face directory do.

The material is tests/integration/vision_material.py's random Qwen2.5-VL with a 3-block vision tower
(the shared one has 2: llama.cpp's converter maps ``visual.merger.mlp.{bid}`` only for block ids below
the vision depth, so ``mlp.2`` needs depth 3), converted once per session with
``convert_hf_to_gguf.py --outtype f32`` (text) and ``--mmproj`` (projector)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from tests.integration.test_vision import PROMPT, decoded, png
from tests.llamacpp import llama_cpp_src
from tests.servers import ServerThread

from ortserve.errors import ModelError, StoreError
from ortserve.models.store import ModelStore, Variant, sha256_file

pytest.importorskip("mobius")
pytest.importorskip("transformers")


def build_material(out: Path) -> Path:
    """The random Qwen2.5-VL, vision depth 3 (module docstring), as a Hugging Face directory."""
    from tests.integration import vision_material as vm

    cfg = vm.tiny_config()
    cfg["vision_config"]["depth"] = 3   # full attention in block 1, as the shared model (n_wa_pattern 2)
    return vm.build_hf_dir(out, config=cfg)


CONVERT = """import json, os, runpy, sys
script, runs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, os.path.dirname(script))
for args in runs:
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
"""


def convert(hf: Path, out: Path) -> tuple[Path, Path]:
    """llama.cpp's converter, both halves in one process (torch imported once: 13 s where two
    processes took 27 s at load 8.5; the same bytes): (text.gguf, mmproj.gguf)."""
    script = llama_cpp_src() / "convert_hf_to_gguf.py"
    text, mmproj = out / "text.gguf", out / "mmproj.gguf"
    runs = [[str(hf), "--outtype", "f32", *extra, "--outfile", str(f)] for extra, f in (([], text), (["--mmproj"], mmproj))]
    run = subprocess.run([sys.executable, "-c", CONVERT, str(script), json.dumps(runs)], capture_output=True, text=True,
                         timeout=600, check=False)
    assert run.returncode == 0 and text.is_file() and mmproj.is_file(), (run.stdout + run.stderr)[-3000:]
    return text, mmproj


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The material, its GGUF pair, and one ORTSERVE_HOME holding the pair's import (through the CLI)
    and the Hugging Face directory's import (fp32, no logits check) of the same weights."""
    from click.testing import CliRunner

    from ortserve.cli.main import cli
    from ortserve.models.vision.importer import import_vision

    root = tmp_path_factory.mktemp("gguf-vl")
    hf = build_material(root / "hf")
    home = root / "home"
    store = ModelStore(home / "models")
    with ThreadPoolExecutor(1) as pool, pytest.MonkeyPatch.context() as mp:
        # the reference's import (its mobius export a subprocess) runs while the converter does
        ref = pool.submit(import_vision, store, hf, "hf-vl", quality=False)
        text, mmproj = convert(hf, root)
        mp.setenv("ORTSERVE_HOME", str(home))
        run = CliRunner().invoke(cli, ["models", "import", str(text), "--mmproj", str(mmproj), "--id", "gguf-vl",
                                       "--json"])
        assert run.exit_code == 0, run.output
        return {"hf": hf, "text": text, "mmproj": mmproj, "home": home, "store": store,
                "gguf": store.get("gguf-vl:fp32-cpu"), "ref": ref.result()}


def test_the_pair_is_a_vision_model_recording_both_files(pair: dict[str, Any]) -> None:
    v: Variant = pair["gguf"]
    assert v.kind == "vision" and v.architecture == "qwen2_5_vl" and v.precision == "fp32"
    assert v.source == f"gguf+mmproj:{pair['text']}|{pair['mmproj']}"
    notes = v.notes["gguf_pair"]
    for key in ("text", "mmproj"):
        f: Path = pair[key]
        assert notes[key] == {"name": f.name, "path": str(f), "size": f.stat().st_size, "sha256": sha256_file(f)}
    assert notes["projector_type"] == "qwen2.5vl_merger" and notes["tensor_types"] == {"F32": 82}
    assert all((v.model_dir / p).is_file() for p in v.notes["parts"].values())
    # vision_import's check on the rebuilt directory: ortserve's graphs against transformers
    assert v.quality["logits_max_abs_diff"] < 1e-4 and v.quality["same_argmax"]


def test_the_rebuilt_weights_are_the_hugging_face_weights_bit_for_bit(pair: dict[str, Any]) -> None:
    from safetensors import safe_open

    from ortserve.models.gguf.opening import open_reader
    from ortserve.models.vision.pair_weights import made, plan

    outs = plan(open_reader(pair["text"]), "text.gguf", open_reader(pair["mmproj"]), "mmproj.gguf")
    with safe_open(str(pair["hf"] / "model.safetensors"), "np") as ref:
        assert sorted(o.name for o in outs) == sorted(ref.keys())
        for o, w in zip(outs, made(outs), strict=True):   # q/k/v re-fused, the patch halves stacked
            assert np.array_equal(w, ref.get_tensor(o.name)), o.name


def test_first_token_logits_equal_the_hugging_face_imports(pair: dict[str, Any]) -> None:
    from ortserve.vision.runner import MARKER, VisionModel

    prompt = PROMPT.format(MARKER)
    got = {}
    for key in ("gguf", "ref"):
        model = VisionModel(pair[key].model_dir)
        img = decoded(png(seed=3))
        ids = np.asarray(model.inputs(prompt, [img], ["image"])[0]["input_ids"].as_numpy())
        got[key] = (ids, model.first_logits(prompt, [img], ["image"]))
    assert np.array_equal(got["gguf"][0], got["ref"][0])   # the GGUF's tokenizer reads the prompt alike
    assert float(np.abs(got["gguf"][1] - got["ref"][1]).max()) < 1e-4


def test_an_openai_chat_with_an_image_answers_as_the_hugging_face_import(pair: dict[str, Any],
                                                                           tiny_model: Path) -> None:
    url = "data:image/png;base64," + base64.b64encode(png(seed=4)).decode()
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is in the image?"},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
    with ServerThread(tiny_model, home=str(pair["home"])) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        answers = {m: client.chat.completions.create(model=m, messages=messages, max_tokens=8, temperature=0)
                   for m in ("gguf-vl", "hf-vl")}
    got, ref = answers["gguf-vl"], answers["hf-vl"]
    assert got.model == "gguf-vl" and got.usage.completion_tokens >= 1 and got.usage.prompt_tokens > 6
    assert got.choices[0].message.content == ref.choices[0].message.content
    assert got.usage == ref.usage


def fake_gguf(path: Path, arch: str, **meta: Any) -> Path:
    """A GGUF holding only metadata (the checks read nothing else)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        k = key.replace("__", ".")
        if isinstance(value, bool):
            w.add_bool(k, value)
        elif isinstance(value, int):
            w.add_uint32(k, value)
        else:
            w.add_string(k, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_half_alone_a_mismatch_or_another_projector_is_refused_naming_the_file(pair: dict[str, Any],
                                                                                  tmp_path: Path) -> None:
    from ortserve.models.importer import import_path
    from ortserve.models.vision.pair import import_gguf_pair

    store = ModelStore(tmp_path / "models")
    text, mmproj = pair["text"], pair["mmproj"]
    clip = {"clip__has_vision_encoder": True, "clip__vision__projection_dim": 64}
    gemma = fake_gguf(tmp_path / "gemma-mmproj.gguf", "clip", **clip, clip__projector_type="gemma3")
    wide = fake_gguf(tmp_path / "wide-mmproj.gguf", "clip", **{**clip, "clip__vision__projection_dim": 32},
                     clip__projector_type="qwen2.5vl_merger")
    cases = [
        (lambda: import_path(store, text), ["text.gguf", "--mmproj"]),
        (lambda: import_path(store, mmproj), ["mmproj.gguf", "vision projector"]),
        (lambda: import_gguf_pair(store, text, gemma, "x"), ["gemma-mmproj.gguf", "not supported yet: gemma3"]),
        (lambda: import_gguf_pair(store, text, wide, "x"), ["wide-mmproj.gguf", "text.gguf", "32", "64"]),
        (lambda: import_gguf_pair(store, mmproj, text, "x"), ["mmproj.gguf", "not the text model"]),
    ]
    for call, says in cases:
        with pytest.raises(ModelError) as err:
            call()
        said = str(err.value) + " " + (err.value.hint or "")
        assert all(s in said for s in says), said
    assert store.variants() == []   # nothing half-installed
    from ortserve.errors import StorageFull
    from ortserve.models.vision.pair import room

    with pytest.raises(StorageFull, match=r"needs about 2000000000\.0 GB free under"):   # before any write
        room(tmp_path, 10**18)
    from click.testing import CliRunner

    from ortserve.cli.main import cli

    with pytest.MonkeyPatch.context() as mp:   # the same through the command line
        mp.setenv("ORTSERVE_HOME", str(tmp_path))
        alone = CliRunner().invoke(cli, ["models", "import", str(text)])
        requant = CliRunner().invoke(cli, ["models", "import", str(text), "--mmproj", str(mmproj), "--requantize", "int8"])
        folder = CliRunner().invoke(cli, ["models", "import", str(text), "--mmproj", str(tmp_path)])
    assert alone.exit_code == 1 and "text.gguf is the text half" in alone.output and "--mmproj" in alone.output
    assert requant.exit_code == 2 and "drop --link, --requantize" in requant.output
    assert folder.exit_code == 1 and f"{tmp_path} is not a GGUF file" in folder.output
    assert store.variants() == []
    with pytest.raises(StoreError, match="already installed from hf:"):   # another source under that id
        import_gguf_pair(pair["store"], text, mmproj, "hf-vl")


def test_float_and_quantized_tensors_are_read_exactly(tmp_path: Path) -> None:
    """values(): F16 and BF16 widened exactly, Q8_0 and Q4_K dequantized as the project's own numpy
    dequantizer (native/reference.py, written apart from gguf-py) reads the same blocks."""
    import gguf
    import torch

    from ortserve.models.gguf.opening import open_reader
    from ortserve.models.vision.pair_weights import values
    from ortserve.native import reference

    w = np.random.default_rng(0).normal(0, 0.1, (8, 256)).astype(np.float32)
    q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(1)   # Q4_K blocks (gguf-py cannot make them): random codes, fp16 scales set
    q4k = rng.integers(0, 256, (8, 144), dtype=np.uint8)
    q4k[:, 0:4] = np.array([[0.01, 0.003]], np.float16).view(np.uint8)
    blocks = {"f16": gguf.quants.quantize(w, q.F16), "bf16": gguf.quants.quantize(w, q.BF16),
              "q8_0": gguf.quants.quantize(w, q.Q8_0), "q4_k": q4k}
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "qwen2vl")
    for name, kind in {"f16": q.F16, "bf16": q.BF16, "q8_0": q.Q8_0, "q4_k": q.Q4_K}.items():
        writer.add_tensor(name, blocks[name], raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    got = {t.name: values(t, "t.gguf") for t in open_reader(tmp_path / "t.gguf").tensors}
    assert np.array_equal(got["f16"], w.astype(np.float16).astype(np.float32))
    assert np.array_equal(got["bf16"], torch.from_numpy(w).bfloat16().float().numpy())   # round to nearest even
    assert np.array_equal(got["q8_0"], reference.dequantize(reference.Q8_0, blocks["q8_0"], 256))
    assert np.array_equal(got["q4_k"], reference.dequantize(reference.Q4_K, blocks["q4_k"], 256))
    assert all(v.shape == (8, 256) and v.dtype == np.float32 for v in got.values())
