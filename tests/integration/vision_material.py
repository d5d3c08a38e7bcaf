"""A random-weight Qwen2.5-VL built from a config (no download) as test material: 2 text layers,
a 2-block vision tower, tiny hidden sizes, and the real Qwen2.5 tokenizer (Qwen2's BPE vocabulary
from llama.cpp's vocab GGUF, tests/vocab_tokenizers.py, with Qwen2.5's named special tokens in
place of the GGUF's [PAD1516xx] slots). Exported in seconds; cached by the test session.

It also holds what every random vision model shares (mistral3_material.py uses it for Mistral 3):
``save_random_model``, a Hugging Face directory of random weights from a config, and
``import_material``, its import through ortserve's own import into a fresh ORTSERVE_HOME."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Qwen2.5's special tokens after <|im_end|> (151645), in id order: the vocab GGUF names them [PADn].
QWEN25_SPECIALS = [
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
    "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
]
# Qwen2.5-VL's chat template, the parts a chat with images uses (text and image content parts).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' or 'image' in part"
    " or 'image_url' in part %}<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in part %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen25_tokenizer(out: Path) -> None:
    """tokenizer.json + tokenizer_config.json + chat_template.jinja of Qwen2.5(-VL) into ``out``."""
    from vocab_tokenizers import tokenizer_dir

    src = tokenizer_dir("qwen2")
    tok = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    names = {151646 + i: name for i, name in enumerate(QWEN25_SPECIALS)}
    tok["added_tokens"] = [{**a, "content": names.get(a["id"], a["content"])} for a in tok["added_tokens"]
                           if a["id"] <= 151645 + len(QWEN25_SPECIALS)]
    # the GGUF's vocabulary names those ids [PADn] too: HF tokenizers takes an added token's id from
    # the vocabulary by its text, else gives it one past the vocabulary (<|image_pad|> was 151945)
    tok["model"]["vocab"] = {names.get(v, k): v for k, v in tok["model"]["vocab"].items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "model_max_length": 32768, "chat_template": CHAT_TEMPLATE}), encoding="utf-8")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def tiny_config() -> dict[str, Any]:
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
        "vision_end_token_id": 151653, "bos_token_id": 151643, "eos_token_id": 151645,
        "tie_word_embeddings": False, "vocab_size": 151936,
        "text_config": {
            "model_type": "qwen2_5_vl_text", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "rope_theta": 1000000.0, "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
            "rope_scaling": {"type": "mrope", "rope_type": "default", "mrope_section": [2, 3, 3]},
            "torch_dtype": "float32",
        },
        "vision_config": {
            "model_type": "qwen2_5_vl", "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "window_size": 112, "fullatt_block_indexes": [1], "in_chans": 3, "hidden_act": "silu",
            "tokens_per_second": 2,
        },
        "torch_dtype": "float32",
    }


def preprocessor_config() -> dict[str, Any]:
    return {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2, "min_pixels": 3136, "max_pixels": 200704,
    }


def build_hf_dir(out: Path, seed: int = 0, config: dict[str, Any] | None = None) -> Path:
    """A Hugging Face Qwen2.5-VL directory with random weights (config.json, safetensors, tokenizer);
    ``config`` in place of ``tiny_config()`` (a deeper vision tower, say)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    save_random_model(out, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLConfig, config or tiny_config(), seed)
    qwen25_tokenizer(out)
    write_json(out / "preprocessor_config.json", preprocessor_config())
    return out


def save_random_model(out: Path, model_class: Any, config_class: Any, config: dict[str, Any], seed: int = 0,
                      std: float = 0.08) -> Path:
    """``model_class(config_class(**config))`` with its non-norm weights drawn from N(0, ``std``)
    (larger than the default init, so that an image visibly moves the logits), saved as safetensors
    into ``out``, made anew."""
    import torch

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    torch.manual_seed(seed)
    model = model_class(config_class(**config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, std)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value), encoding="utf-8")


def import_material(tmp_path_factory: Any, build: Callable[[Path], Path], name: str,
                    model_id: str) -> tuple[Path, Path, Any]:
    """``build`` a Hugging Face directory in a temp folder ``name`` and import it as ``model_id`` into a
    fresh ORTSERVE_HOME: (the Hugging Face dir, the home, the store variant). A session or module
    fixture calls it, so each model is built and imported once."""
    from ortserve.models.importer import import_path
    from ortserve.models.store import ModelStore

    hf = build(tmp_path_factory.mktemp(name) / "hf")
    home = tmp_path_factory.mktemp(f"{name}-home")
    return hf, home, import_path(ModelStore(home / "models"), hf, model_id=model_id)
