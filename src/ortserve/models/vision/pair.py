"""A llama.cpp Qwen2.5-VL GGUF pair -> a store model of kind vision (issue 42).

``ortserve models import model.gguf --mmproj mmproj.gguf``: llama.cpp keeps a vision-language
model as two files, the text model (architecture ``qwen2vl``) and its multimodal projector, the
"mmproj" (architecture ``clip``, ``clip.projector_type`` ``qwen2.5vl_merger``: the vision tower
``v.*`` and the merger ``mm.*``). ortserve serves Qwen2.5-VL from the three ONNX graphs
models/vision/importer.py exports from a Hugging Face directory, so the pair is turned back into
that directory in a temporary folder and imported by the same code:

* ``config.json`` from the metadata (text: ``qwen2vl.*``; vision: ``clip.vision.*``; the image
  token ids from the vocabulary by name);
* ``model.safetensors``: every tensor under its Hugging Face name (pair_weights.py), float32,
  exactly the file's values (quantized blocks dequantized with gguf-py's arithmetic);
* the tokenizer and chat template from the text GGUF (transformers' GGUF tokenizer reader, which
  needs no config and so reads a ``qwen2vl`` file), ``preprocessor_config.json`` from the
  mmproj's patch size and Qwen2.5-VL's own pixel limits (an mmproj does not carry them).

The manifest records both files (name, size, sha256), ``kind: vision`` and vision/importer.py's logits
check against transformers on the rebuilt directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError, StorageFull, StoreError
from ortserve.models.store import ModelStore, Variant, sha256_file, validate_name
from ortserve.models.variants import Progress

TEXT_ARCH = "qwen2vl"
PROJECTORS = ("qwen2.5vl_merger", "qwen2.5vl", "qwen25vl")   # llama.cpp's name, and how people spell it
PIXELS = {"min_pixels": 3136, "max_pixels": 12845056}        # Qwen2.5-VL's preprocessor_config.json
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)              # what vision/qwen.py normalizes with
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
          "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}


def _meta(path: Path) -> dict[str, Any]:
    from ortserve.models.validate import gguf_metadata, has_gguf_magic

    if not path.is_file():
        raise ModelError(f"{path} is not a GGUF file" if path.exists() else f"{path} does not exist",
                         hint="check the path")
    if not has_gguf_magic(path):
        raise ModelError(f"{path.name} is not a GGUF file")
    return gguf_metadata(path)


def refuse_half(path: Path) -> None:
    """A text GGUF of a vision model given alone, or an mmproj given as the model: a ModelError
    saying what to do. Anything else passes (an unreadable file too: the GGUF import's own checks say why)."""
    try:
        arch = str(_meta(path).get("general.architecture", ""))
    except ModelError:
        return
    if arch == TEXT_ARCH:
        raise ModelError(f"{path.name} is the text half of a Qwen2-VL/Qwen2.5-VL model (architecture {TEXT_ARCH}); "
                         "it needs its vision projector",
                         hint=f"ortserve models import {path} --mmproj MMPROJ.gguf")
    if arch == "clip":
        raise ModelError(f"{path.name} is a vision projector (mmproj, architecture clip), not a model",
                         hint=f"give it beside its text model: ortserve models import MODEL.gguf --mmproj {path}")


def check_pair(text: Path, mmproj: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both files' metadata, or a ModelError naming the file that does not fit."""
    tm, vm = _meta(text), _meta(mmproj)
    arch = str(tm.get("general.architecture", ""))
    if arch == "clip":
        raise ModelError(f"{text.name} is a vision projector (mmproj), not the text model",
                         hint="ortserve models import MODEL.gguf --mmproj MMPROJ.gguf (the model first)")
    if arch != TEXT_ARCH:
        raise ModelError(f"{text.name}: architecture {arch or '(none)'!r}; --mmproj imports Qwen2.5-VL text models "
                         f"({TEXT_ARCH})", hint="import a text-only GGUF without --mmproj")
    if str(vm.get("general.architecture", "")) != "clip" or not vm.get("clip.has_vision_encoder", False):
        raise ModelError(f"{mmproj.name} is not a vision projector (an mmproj GGUF of architecture clip with a "
                         "vision encoder)", hint="give llama.cpp's mmproj file of this model with --mmproj")
    kind = str(vm.get("clip.projector_type", ""))
    if kind not in PROJECTORS:
        raise ModelError(f"{mmproj.name}: projector type not supported yet: {kind or '(none)'}",
                         hint="ortserve imports Qwen2.5-VL mmproj files (qwen2.5vl_merger); others are issue 42's "
                              "next steps")
    hidden, proj = int(tm.get(f"{TEXT_ARCH}.embedding_length", 0)), int(vm.get("clip.vision.projection_dim", -1))
    if hidden != proj:
        raise ModelError(f"{mmproj.name} does not match {text.name}: it projects images to {proj} values, the text "
                         f"model's hidden size is {hidden}", hint="use the mmproj file made from the same model")
    for key, want in (("clip.vision.image_mean", CLIP_MEAN), ("clip.vision.image_std", CLIP_STD)):
        got = vm.get(key)
        if got is not None and not np.allclose(np.asarray(got, np.float64), want, atol=1e-6):
            raise ModelError(f"{mmproj.name}: {key} is {list(got)}; ortserve's Qwen2.5-VL preprocessing uses "
                             f"{list(want)}", hint="a Qwen2.5-VL mmproj normalizes images with CLIP's values")
    return tm, vm


def _f32(x: Any) -> float:
    """The shortest decimal of a float32 metadata value (9.99999997e-07 -> 1e-06)."""
    return float(str(np.float32(x)))


def hf_config(tm: dict[str, Any], vm: dict[str, Any], ids: dict[str, int], vocab: int, tied: bool) -> dict[str, Any]:
    """config.json of a Qwen2_5_VLForConditionalGeneration from the two files' metadata."""
    a = TEXT_ARCH
    heads = int(tm[f"{a}.attention.head_count"])
    sections = [int(x) for x in tm.get(f"{a}.rope.dimension_sections") or []][:3]
    eos = int(tm.get("tokenizer.ggml.eos_token_id", 0))
    bos = int(tm.get("tokenizer.ggml.bos_token_id", eos))
    text = {"model_type": "qwen2_5_vl_text", "vocab_size": vocab, "hidden_size": int(tm[f"{a}.embedding_length"]),
            "intermediate_size": int(tm[f"{a}.feed_forward_length"]), "num_hidden_layers": int(tm[f"{a}.block_count"]),
            "num_attention_heads": heads, "num_key_value_heads": int(tm.get(f"{a}.attention.head_count_kv", heads)),
            "max_position_embeddings": int(tm.get(f"{a}.context_length", 32768)),
            "rms_norm_eps": _f32(tm.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)), "hidden_act": "silu",
            "rope_theta": _f32(tm.get(f"{a}.rope.freq_base", 1000000.0)), "tie_word_embeddings": tied,
            "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "float32",
            "rope_scaling": {"type": "mrope", "rope_type": "default", "mrope_section": sections}}
    depth, pattern = int(vm["clip.vision.block_count"]), int(vm.get("clip.vision.n_wa_pattern", 0) or 0)
    vision = {"model_type": "qwen2_5_vl", "depth": depth, "hidden_size": int(vm["clip.vision.embedding_length"]),
              "intermediate_size": int(vm["clip.vision.feed_forward_length"]),
              "num_heads": int(vm["clip.vision.attention.head_count"]),
              "out_hidden_size": int(vm["clip.vision.projection_dim"]),
              "patch_size": int(vm.get("clip.vision.patch_size", 14)),
              "spatial_merge_size": int(vm.get("clip.vision.spatial_merge_size", 2)), "temporal_patch_size": 2,
              "window_size": int(vm.get("clip.vision.window_size", 112)),
              # llama.cpp keeps the period of the full-attention blocks: block i is full where (i + 1) % n == 0
              "fullatt_block_indexes": [i for i in range(depth) if pattern and (i + 1) % pattern == 0],
              "in_chans": 3, "hidden_act": "silu", "tokens_per_second": 2}
    return {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", **ids,
            "bos_token_id": bos, "eos_token_id": eos, "tie_word_embeddings": tied, "vocab_size": vocab,
            "text_config": text, "vision_config": vision, "torch_dtype": "float32"}


def preprocessor(vm: dict[str, Any]) -> dict[str, Any]:
    return {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
            "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "do_convert_rgb": True, "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD),
            "patch_size": int(vm.get("clip.vision.patch_size", 14)), "temporal_patch_size": 2,
            "merge_size": int(vm.get("clip.vision.spatial_merge_size", 2)), **PIXELS}


def write_tokenizer(text: Path, out: Path, rows: int) -> dict[str, int]:
    """tokenizer.json, its config and the chat template from the text GGUF; the image token ids."""
    import json

    from ortserve.models.gguf_vocab import fit_tokenizer, keep_fim_ids
    from ortserve.models.validate import gguf_metadata

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError as exc:
        from ortserve.errors import DependencyMissing

        raise DependencyMissing("importing a GGUF vision model needs transformers",
                                hint="pip install 'ortserve[convert]'") from exc
    try:   # the tokenizer class itself reads the file: AutoTokenizer would first want a config for qwen2vl
        tok = PreTrainedTokenizerFast.from_pretrained(str(text.parent), gguf_file=text.name)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelError(f"cannot read the tokenizer of {text.name}: {exc}".splitlines()[0]) from exc
    tok.save_pretrained(str(out))
    fit_tokenizer(out, rows)
    keep_fim_ids(gguf_metadata(text), out)
    vocab = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    names = {**vocab["model"]["vocab"], **{a["content"]: a["id"] for a in vocab.get("added_tokens") or []}}
    missing = [t for t in TOKENS.values() if t not in names]
    if missing:
        raise ModelError(f"{text.name}: the vocabulary lacks {', '.join(missing)}; it is not a Qwen2.5-VL tokenizer")
    return {key: int(names[t]) for key, t in TOKENS.items()}


def rebuild_hf(text: Path, mmproj: Path, out: Path, progress: Progress | None = None) -> dict[str, Any]:
    """The Hugging Face Qwen2.5-VL directory of the pair into ``out``; returns the weights' notes."""
    import json

    from ortserve.models.gguf.opening import open_reader
    from ortserve.models.vision.pair_weights import plan, types, write_safetensors

    say = progress or (lambda _m: None)
    tm, vm = check_pair(text, mmproj)
    readers = []
    for path in (text, mmproj):
        try:
            readers.append(open_reader(path))
        except (ValueError, OSError) as exc:
            raise ModelError(f"{path.name} is truncated or corrupt: {exc}", hint="re-download the file") from exc
    outs = plan(readers[0], text.name, readers[1], mmproj.name)
    room(out.parent, sum(4 * int(np.prod(o.shape, dtype=np.int64)) for o in outs))
    shapes = {o.name: o.shape for o in outs}
    rows = shapes["model.embed_tokens.weight"][0]
    out.mkdir(parents=True, exist_ok=True)
    say(f"reading the tokenizer of {text.name}")
    ids = write_tokenizer(text, out, rows)
    cfg = hf_config(tm, vm, ids, rows, tied="lm_head.weight" not in shapes)
    (out / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}), encoding="utf-8")
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor(vm), indent=2), encoding="utf-8")
    say(f"writing {len(outs)} tensors as a Hugging Face Qwen2.5-VL (float32)")
    write_safetensors(outs, out / "model.safetensors", say)
    return {"tensor_types": types(outs), "tensors": len(outs), "projector_type": str(vm["clip.projector_type"])}


def room(where: Path, f32_bytes: int) -> None:
    """Refuse before writing when the disk cannot hold the float32 weights twice (the rebuilt
    safetensors and the exported graphs, side by side until the scratch folder goes)."""
    free = shutil.disk_usage(where).free
    if free < 2 * f32_bytes:
        raise StorageFull(f"importing this pair needs about {2 * f32_bytes / 1e9:.1f} GB free under {where} "
                          f"(its weights in float32, twice); {free / 1e9:.1f} GB is free",
                          param="model", hint="free space there or point ORTSERVE_HOME at a bigger disk")


def _file(path: Path) -> dict[str, Any]:
    return {"name": path.name, "path": str(path), "size": path.stat().st_size, "sha256": sha256_file(path)}


def _work_dir(store: ModelStore) -> Path:
    """A scratch folder beside the store (the rebuilt weights are as large as the model in float32);
    a killed import's folder is removed by the next import. Named so that the store's own sweeps,
    which remove ``<variant>.<pid>.<hex>`` folders, never take a live one."""
    root = store.root / ".tmp"
    root.mkdir(parents=True, exist_ok=True)
    for d in root.glob("gguf-pair-*"):
        pid = d.name.split("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"gguf-pair-{os.getpid()}-", dir=root))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # exists, but another user's (Windows: any error): leave it
        return True
    return True


def import_gguf_pair(store: ModelStore, text_gguf: Path, mmproj_gguf: Path, model_id: str, *,
                     progress: Progress | None = None, quality: bool = True) -> Variant:
    """Import a llama.cpp Qwen2.5-VL text GGUF and its mmproj as the vision model ``model_id``."""
    from ortserve.models.vision.importer import import_vision

    validate_name(model_id)
    text, mmproj = Path(text_gguf).expanduser().resolve(), Path(mmproj_gguf).expanduser().resolve()
    check_pair(text, mmproj)   # in a second, before anything is written
    source = f"gguf+mmproj:{text}|{mmproj}"
    for have in store.find(model_id):
        if have.model == model_id:
            if have.source == source:
                return have
            raise StoreError(f"model id {model_id!r} is already installed from {have.source}",
                             hint=f"`ortserve models rm {model_id}`, or import with --id NAME")
    say = progress or (lambda _m: None)
    work = _work_dir(store)
    try:
        say(f"rebuilding {text.name} + {mmproj.name} as a Hugging Face directory")
        weights = rebuild_hf(text, mmproj, work / "hf", progress)
        v = import_vision(store, work / "hf", model_id, progress=progress, quality=quality, source=source)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say("recording the source files (sha256)")
    pair = {"text": _file(text), "mmproj": _file(mmproj), **weights}
    return store.update_manifest(v, notes={**v.notes, "gguf_pair": pair})
