"""A random-weight Mistral 3 (Pixtral vision tower + Mistral text decoder, ``model_type: mistral3``)
built from a config (no download) as test material: 2 text layers, a 1-layer Pixtral tower, tiny
hidden sizes. Its tokenizer is built here honestly, not Mistral 3's own: llama.cpp ships no vocab
GGUF of Mistral's Tekken tokenizer, so it is Llama 2's 32,000-entry SentencePiece vocabulary
(ggml-vocab-llama-spm.gguf, tests/vocab_tokenizers.py; the vocabulary family of Mistral's first
models) with Mistral 3's three image tokens added after it: ``[IMG]`` 32000, ``[IMG_BREAK]``
32001, ``[IMG_END]`` 32002 (Mistral's own ids are 10, 12, 13). Exported in seconds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

IMG, IMG_BREAK, IMG_END = 32000, 32001, 32002
VOCAB = 32008
# Mistral's [INST] template, the parts a chat with images uses; an image part is one [IMG], which
# ortserve (vision/mistral.py) expands to the image's rows as Mistral 3's processor does.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% elif message['role'] == 'user' %}[INST]{{ ns.system }}{% set ns.system = '' %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}[IMG]{% elif 'text' in part %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}[/INST]"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def mistral3_tokenizer(out: Path) -> None:
    """tokenizer.json (+ config, template) into ``out``: Llama 2's vocabulary and the image tokens."""
    from tokenizers import AddedToken, Tokenizer
    from vocab_tokenizers import tokenizer_dir

    tok = Tokenizer.from_file(str(tokenizer_dir("llama-spm") / "tokenizer.json"))
    base = tok.get_vocab_size(with_added_tokens=True)
    if base != IMG:
        raise RuntimeError(f"llama-spm's vocabulary has {base} entries, not {IMG}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("[IMG]", "[IMG_BREAK]", "[IMG_END]")])
    if [tok.token_to_id(t) for t in ("[IMG]", "[IMG_BREAK]", "[IMG_END]")] != [IMG, IMG_BREAK, IMG_END]:
        raise RuntimeError("the image tokens did not get ids 32000-32002")
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 4096, "chat_template": CHAT_TEMPLATE}), encoding="utf-8")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def tiny_config() -> dict[str, Any]:
    return {
        "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
        "image_token_index": IMG, "spatial_merge_size": 2, "vision_feature_layer": -1,
        "projector_hidden_act": "gelu", "multimodal_projector_bias": False, "tie_word_embeddings": False,
        "text_config": {
            "model_type": "mistral", "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_theta": 1000000.0,
            "sliding_window": None, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        },
        "vision_config": {
            "model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "head_dim": 16, "patch_size": 14, "image_size": 1540, "hidden_act": "silu",
            "rope_theta": 10000.0,
        },
        "torch_dtype": "float32",
    }


def preprocessor_config() -> dict[str, Any]:
    return {
        "image_processor_type": "PixtralImageProcessor", "processor_class": "PixtralProcessor",
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "patch_size": {"height": 14, "width": 14},
        "size": {"longest_edge": 336},
    }


def build_hf_dir(out: Path, seed: int = 0) -> Path:
    """A Hugging Face Mistral 3 directory with random weights (config.json, safetensors, tokenizer),
    built as vision_material.py builds Qwen2.5-VL's."""
    from tests.integration.vision_material import save_random_model, write_json
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    save_random_model(out, Mistral3ForConditionalGeneration, Mistral3Config, tiny_config(), seed)
    mistral3_tokenizer(out)
    write_json(out / "preprocessor_config.json", preprocessor_config())
    write_json(out / "processor_config.json", {
        "processor_class": "PixtralProcessor", "patch_size": 14, "spatial_merge_size": 2, "image_token": "[IMG]",
        "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"})
    return out
