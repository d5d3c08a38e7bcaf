"""Test material for LoRA (issue 35): PEFT adapters made with peft on the tiny random Llama (random,
nonzero A and B on every attention and MLP projection), imported into a store, and the merged-weights
models (W + scale * B @ A) exported separately through ortserve's builder path as the reference.
The ``lora`` fixture is session-wide (tests/integration/conftest.py): test_lora.py and
test_lora_serving.py share one build."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ortserve.models.adapters import import_adapter, load_adapter
from ortserve.models.store import ModelStore

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_peft(hf_dir: Path, out: Path, *, seed: int, r: int, merged: Path | None = None) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ortserve.models.convert import copy_tokenizer_files

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    # init_lora_weights=False: A and B both random (peft's default zero B would be a no-op adapter)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=TARGETS,
                                                  init_lora_weights=False))
    peft_model.save_pretrained(out)
    if merged is not None:
        peft_model.merge_and_unload().save_pretrained(merged)
        copy_tokenizer_files(hf_dir, merged)
    return out


@pytest.fixture(scope="session")
def lora(tmp_path_factory: pytest.TempPathFactory, tiny_hf_dir: Path, tiny_model: Path) -> SimpleNamespace:
    from ortserve.models.convert import build_onnx

    root = tmp_path_factory.mktemp("lora")
    one = make_peft(tiny_hf_dir, root / "my-adapter", seed=1, r=4, merged=root / "merged-hf")
    two = make_peft(tiny_hf_dir, root / "other", seed=2, r=8)
    merged = build_onnx(root / "merged-hf", root / "merged-onnx", precision="fp32")
    home = root / "home"
    store = ModelStore(home / "models")
    store.install("tiny", "fp32-cpu", lambda _tmp: {"precision": "fp32", "device": "cpu", "link": str(tiny_model)})
    v1 = import_adapter(store, one, "tiny")
    v2 = import_adapter(store, two, "tiny")
    return SimpleNamespace(root=root, one=one, two=two, merged=merged, home=home, store=store,
                           adapters=[load_adapter(v1), load_adapter(v2)])


def merge_scaled(hf_dir: Path, adapter: Path, scale: float, out: Path) -> Path:
    """PEFT's merge of ``adapter`` at ``scale`` times its own alpha/r (W + scale * alpha/r * B @ A):
    the reference for a request's lora_scale, as llama-server's per-request scale means."""
    import torch
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM

    from ortserve.models.convert import copy_tokenizer_files

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32), adapter)
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert layers
    for m in layers:
        m.scaling["default"] *= scale
    model.merge_and_unload().save_pretrained(out)
    copy_tokenizer_files(hf_dir, out)
    return out


@pytest.fixture(scope="session")
def lora_half(lora: SimpleNamespace, tiny_hf_dir: Path) -> Path:
    """The merged model of ``my-adapter`` at lora_scale 0.5, exported like ``lora.merged``."""
    from ortserve.models.convert import build_onnx

    hf = merge_scaled(tiny_hf_dir, lora.one, 0.5, lora.root / "merged-half-hf")
    return Path(build_onnx(hf, lora.root / "merged-half-onnx", precision="fp32"))
