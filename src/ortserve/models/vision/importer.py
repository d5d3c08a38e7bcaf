"""A Hugging Face vision-language directory (Qwen2.5-VL, Mistral 3) -> a store model with its vision,
embedding and decoder graphs.

onnxruntime-genai's builder exports only the text decoder of these models; PyPI's ``mobius-onnx``
(in the ``convert`` extra) writes all three graphs and og's genai_config.json from the Hugging
Face config and safetensors. Its output needs three fixes to load and answer right in og 0.18:

* ``model.type``: it writes the text config's (``qwen2_5_vl_text``, ``mistral``); og's multimodal
  pipeline (and Qwen's mRoPE positions) is the family's own (``qwen2_5_vl``, ``mistral3``);
* ``processor_config.json``: its ``ConvertRGB`` step after ``DecodeImage`` (already RGB) swaps
  red and blue; it is dropped (ortserve cuts the patches itself, vision/qwen.py, but og's own
  processor then reads colours right too);
* ``tokenizer_config.json``: og's tokenizer needs a tokenizer class it knows (``Qwen2Tokenizer``;
  Mistral 3 keeps its own).

Gemma 3 (``gemma3``) is not imported: mobius-onnx's decoder for it is causal only, where Gemma 3
attends both ways within each image's tokens (docs/vision.md, "Gemma 3").

ortserve's notes (``vision.json``: the preprocessing sizes, the image token) sit beside the og files.
The manifest says ``kind: "vision"`` and records the parts and, where transformers is installed,
the agreement of the first-token logits with transformers on a test image (``quality``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ortserve.errors import DependencyMissing, ModelError
from ortserve.models.store import ModelStore, Variant, validate_name
from ortserve.models.variants import Progress, variant_name

FAMILIES = ("qwen2_5_vl", "mistral3")
PARTS = {"vision": "vision_encoder/model.onnx", "embedding": "embedding/model.onnx", "decoder": "decoder/model.onnx"}


def vision_family(path: Path) -> str | None:
    """The model_type of a Hugging Face directory this import serves, or None."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    try:
        kind = json.loads(cfg.read_text(encoding="utf-8")).get("model_type")
    except ValueError:
        return None
    return kind if kind in FAMILIES else None


def export(src: Path, out: Path, progress: Progress | None = None) -> None:
    """mobius-onnx's three graphs and og config for ``src`` into ``out`` (a subprocess: it imports torch)."""
    import importlib.util

    if importlib.util.find_spec("mobius") is None:
        raise DependencyMissing("importing a vision model needs mobius-onnx",
                                hint="pip install 'ortserve[convert]' (or: pip install mobius-onnx)")
    (progress or (lambda _m: None))("exporting the vision, embedding and decoder graphs (mobius-onnx)")
    cmd = [sys.executable, "-m", "mobius", "build", "--config", str(src), "--runtime", "ort-genai", "--ep", "cpu",
           str(out)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise ModelError(f"mobius-onnx could not export {src}: {done.stderr.strip()[-2000:]}")


def fix_for_og(src: Path, out: Path, family: str) -> dict[str, Any]:
    """The three fixes (module docstring) and ortserve's vision.json; returns the notes."""
    cfg_path = out / "genai_config.json"
    genai = json.loads(cfg_path.read_text(encoding="utf-8"))
    genai["model"]["type"] = family
    cfg_path.write_text(json.dumps(genai, indent=2), encoding="utf-8")
    proc_path = out / "processor_config.json"
    if proc_path.is_file():
        proc = json.loads(proc_path.read_text(encoding="utf-8"))
        steps = proc.get("processor", {}).get("transforms", [])
        proc["processor"]["transforms"] = [t for t in steps if t.get("operation", {}).get("type") != "ConvertRGB"]
        proc_path.write_text(json.dumps(proc, indent=2), encoding="utf-8")
    tok_path = out / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text(encoding="utf-8")) if tok_path.is_file() else {}
    if family == "qwen2_5_vl" or "tokenizer_class" not in tok:
        tok["tokenizer_class"] = "Qwen2Tokenizer" if family == "qwen2_5_vl" else "LlamaTokenizer"
    tok_path.write_text(json.dumps(tok, indent=2), encoding="utf-8")
    for name in ("chat_template.jinja", "generation_config.json"):
        if (src / name).is_file() and not (out / name).is_file():
            shutil.copy2(src / name, out / name)
    hf = json.loads((src / "config.json").read_text(encoding="utf-8"))
    pre_path = src / "preprocessor_config.json"
    pre = json.loads(pre_path.read_text(encoding="utf-8")) if pre_path.is_file() else {}
    notes = _mistral3_notes(hf, pre, out) if family == "mistral3" else {
        "family": family, "image_token_id": hf.get("image_token_id"),
        "preprocess": {k: pre[k] for k in QWEN_KEYS if k in pre}}
    notes["parts"] = PARTS
    (out / "vision.json").write_text(json.dumps(notes, indent=2), encoding="utf-8")
    missing = [p for p in PARTS.values() if not (out / p).is_file()]
    if missing:
        raise ModelError(f"the export of {src} lacks {', '.join(missing)}")
    return notes


QWEN_KEYS = ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size")


def _mistral3_notes(hf: dict[str, Any], pre: dict[str, Any], out: Path) -> dict[str, Any]:
    """Mistral 3's notes: the image, row-break and end token ids, Pixtral's preprocessing sizes."""
    from ortserve.vision.runner import special_id

    vision = hf.get("vision_config") or {}
    patch = pre.get("patch_size", vision.get("patch_size", 14))
    size = pre.get("size") or {}
    ids = {name: special_id(out, text) for name, text in (("image_break_token_id", "[IMG_BREAK]"),
                                                           ("image_end_token_id", "[IMG_END]"))}
    if None in ids.values():
        raise ModelError(f"the tokenizer of {out} lacks Mistral 3's [IMG_BREAK] or [IMG_END] token")
    return {"family": "mistral3", "image_token_id": hf.get("image_token_index", hf.get("image_token_id", 10)), **ids,
            "preprocess": {"patch_size": int(patch["height"] if isinstance(patch, dict) else patch),
                           "spatial_merge_size": int(hf.get("spatial_merge_size", 2)),
                           "longest_edge": int(size.get("longest_edge", vision.get("image_size", 1540))),
                           "image_mean": pre.get("image_mean", [0.48145466, 0.4578275, 0.40821073]),
                           "image_std": pre.get("image_std", [0.26862954, 0.26130258, 0.27577711])}}


def import_vision(store: ModelStore, src: Path, model_id: str, *, progress: Progress | None = None,
                  quality: bool = True, source: str | None = None) -> Variant:
    """Export, fix and install a Hugging Face vision-language directory as ``model_id``."""
    validate_name(model_id)
    src = Path(src).resolve()
    family = vision_family(src)
    if family is None:
        raise ModelError(f"{src} is not a vision model ortserve imports ({', '.join(FAMILIES)})")
    say = progress or (lambda _m: None)

    def build(tmp: Path) -> dict[str, Any]:
        work = Path(tempfile.mkdtemp(prefix=".vision-", dir=tmp.parent))
        try:
            export(src, work / "out", progress)
            for item in (work / "out").iterdir():
                shutil.move(str(item), str(tmp / item.name))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        notes = fix_for_og(src, tmp, family)
        hf = json.loads((src / "config.json").read_text(encoding="utf-8"))
        text = hf.get("text_config") or hf
        fields: dict[str, Any] = {"precision": "fp32", "device": "cpu", "kind": "vision", "architecture": family,
                                  "context_length": int(text.get("max_position_embeddings", 4096)),
                                  "source": source or f"hf:{src}", "notes": notes}
        if quality:
            say("checking the first-token logits against transformers on a test image")
            fields["quality"] = (mistral3_agreement if family == "mistral3" else agreement)(src, tmp)
        return fields

    return store.install(model_id, variant_name("fp32", "cpu"), build)


def agreement(hf_dir: Path, model_dir: Path) -> dict[str, Any]:
    """Max |logit difference| of the first token, ortserve vs transformers, on a fixed 56x84 image
    (or why it could not be measured)."""
    try:
        import numpy as np
        import torch
        from PIL import Image
        from transformers import Qwen2_5_VLForConditionalGeneration
    except ImportError as exc:
        return {"logits_max_abs_diff": None, "why": f"not measured: {exc}"}
    from ortserve.vision import qwen
    from ortserve.vision.images import Decoded
    from ortserve.vision.runner import MARKER, VisionModel

    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (56, 84, 3), dtype=np.uint8))
    prompt = f"<|im_start|>user\n{MARKER}Describe the image.<|im_end|>\n<|im_start|>assistant\n"
    model = VisionModel(model_dir)
    ours = model.first_logits(prompt, [Decoded(84, 56, "PNG", rgb)], ["image"])
    named, _ = model.inputs(prompt, [Decoded(84, 56, "PNG", rgb)], ["image"])
    ids = torch.tensor(np.asarray(named["input_ids"].as_numpy()), dtype=torch.long)
    pv, grid = qwen.patches(rgb, model.pre)
    hf = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        # mm_token_type_ids: without it transformers 5 computes no mRoPE positions (plain 1-D ones)
        ref = hf(input_ids=ids, pixel_values=torch.from_numpy(pv), image_grid_thw=torch.tensor([grid]),
                 mm_token_type_ids=(ids == hf.config.image_token_id).int()).logits[0, -1]
    diff = float(np.abs(ref.numpy() - ours).max())
    return {"logits_max_abs_diff": diff, "same_argmax": bool(int(ref.argmax()) == int(ours.argmax()))}


def mistral3_agreement(hf_dir: Path, model_dir: Path) -> dict[str, Any]:
    """Mistral 3's check: the first-token logits of the exported graphs as ortserve feeds them
    (vision/mistral.py: its pixels, the [IMG]/[IMG_BREAK]/[IMG_END] layout, the embedding graph)
    against ``Mistral3ForConditionalGeneration`` on the same fixed 84x56 image."""
    try:
        import numpy as np
        import torch
        from PIL import Image
        from tokenizers import Tokenizer
        from transformers import Mistral3ForConditionalGeneration
    except ImportError as exc:
        return {"logits_max_abs_diff": None, "why": f"not measured: {exc}"}
    from ortserve.vision import mistral
    from ortserve.vision.features import Encoder
    from ortserve.vision.rows import BASE

    notes = json.loads((model_dir / "vision.json").read_text(encoding="utf-8"))
    gc = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]
    pre = mistral.Preprocess.from_config(notes["preprocess"])
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (56, 84, 3), dtype=np.uint8))
    pv, grid = mistral.pixels(rgb, pre), mistral.grid(84, 56, pre)
    vis = gc["vision"]
    feats = Encoder(model_dir / vis["filename"], vis.get("inputs", {}),
                    vis.get("outputs", {}).get("image_features", "image_features")).features("", lambda: pv, grid)
    image_id = int(notes["image_token_id"])
    feed = mistral.MistralFeed(model_dir / gc["embedding"]["filename"], image_id, int(notes["image_break_token_id"]),
                               int(notes["image_end_token_id"]))
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = tok.encode(f"<s>[INST]{mistral.MARKER}Describe the image.[/INST]", add_special_tokens=False).ids
    ids = feed.expand(text, [feed.register("check", feats, grid)])
    ours = mistral.first_logits(feed, model_dir / gc["decoder"]["filename"], ids)
    real = torch.tensor([[i if i < BASE else image_id for i in ids]], dtype=torch.long)
    hf = Mistral3ForConditionalGeneration.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(input_ids=real, pixel_values=torch.from_numpy(pv),
                 image_sizes=torch.tensor([list(pv.shape[2:])])).logits[0, -1]
    diff = float(np.abs(ref.numpy() - ours).max())
    return {"logits_max_abs_diff": diff, "same_argmax": bool(int(ref.argmax()) == int(ours.argmax()))}
