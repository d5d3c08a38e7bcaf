"""A llama.cpp Qwen2.5-VL GGUF pair's tensors under their Hugging Face names, written as one
safetensors file a tensor at a time (models/vision/pair.py).

llama.cpp's converter (``convert_hf_to_gguf.py``, ``conversion/qwenvl.py``) renames every tensor
and reshapes two kinds; this is the inverse:

* text (``qwen2vl``): ``blk.N.attn_q`` -> ``model.layers.N.self_attn.q_proj`` and so on, as for
  Qwen2; no row permutation (llama.cpp permutes Q/K rows only for llama-style RoPE, not Qwen's
  NeoX-style rotation), ``output.weight`` is ``lm_head.weight`` (absent: tied embeddings);
* vision (``clip``): the fused ``visual.blocks.N.attn.qkv`` was split into ``v.blk.N.attn_q/k/v``
  (rows concatenated back, q then k then v), and the Conv3D patch embedding
  ``[C, 3, 2, 14, 14]`` into two Conv2D halves ``v.patch_embd.weight`` (temporal slot 0) and
  ``v.patch_embd.weight.1`` (slot 1), stacked back on axis 2.

Every value is written as float32: F32 copied, F16 and BF16 widened (exact), quantized blocks
dequantized with gguf-py's own arithmetic (``gguf.quants.dequantize``, llama.cpp's reference).
A tensor this map does not know is refused, never dropped.
"""

from __future__ import annotations

import json
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError

TEXT_BLOCK = {   # blk.N.<gguf> -> model.layers.N.<hf>
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
}
TEXT_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
            "output.weight": "lm_head.weight"}
VISION_BLOCK = {  # v.blk.N.<gguf> -> visual.blocks.N.<hf> (attn_q/k/v are fused, below)
    "attn_out.weight": "attn.proj.weight", "attn_out.bias": "attn.proj.bias",
    "ln1.weight": "norm1.weight", "ln2.weight": "norm2.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.weight": "mlp.down_proj.weight", "ffn_down.bias": "mlp.down_proj.bias",
}
VISION_TOP = {"v.post_ln.weight": "visual.merger.ln_q.weight",
              "mm.0.weight": "visual.merger.mlp.0.weight", "mm.0.bias": "visual.merger.mlp.0.bias",
              "mm.2.weight": "visual.merger.mlp.2.weight", "mm.2.bias": "visual.merger.mlp.2.bias"}
PATCH = ("v.patch_embd.weight", "v.patch_embd.weight.1")
FLOATS = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class Names:
    """One file's renaming: ``<block>.N.<gguf>`` -> ``<hf_block>.N.<hf>`` by ``per_block``, any
    other name by ``top``; what is not in either is refused with ``refusal``."""

    block: str
    hf_block: str
    per_block: dict[str, str]
    top: dict[str, str]
    refusal: str
    hint: str


TEXT = Names("blk", "model.layers", TEXT_BLOCK, TEXT_TOP, "a Qwen2.5-VL text model",
             "convert the model with llama.cpp's convert_hf_to_gguf.py")
VISION = Names("v.blk", "visual.blocks", VISION_BLOCK, VISION_TOP, "a Qwen2.5-VL vision tower",
               "use an mmproj made by llama.cpp's convert_hf_to_gguf.py --mmproj")


def hf_name(gguf_name: str, file: str, names: Names) -> str:
    """The Hugging Face name of one GGUF tensor of ``file`` (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); a name the map lacks is a ModelError."""
    m = re.fullmatch(re.escape(names.block) + r"\.(\d+)\.(.+)", gguf_name)
    hf = f"{names.hf_block}.{m.group(1)}.{names.per_block[m.group(2)]}" if m and m.group(2) in names.per_block \
        else names.top.get(gguf_name)
    if hf is None:
        raise ModelError(f"{file}: tensor {gguf_name} is not part of {names.refusal} ortserve knows", hint=names.hint)
    return hf


@dataclass
class Out:
    """One Hugging Face tensor: its name, shape, the GGUF tensors it is made of and how."""

    name: str
    shape: tuple[int, ...]
    parts: list[tuple[Any, str]]              # (gguf reader tensor, its file's name)
    join: Callable[[list[np.ndarray]], np.ndarray]


def shape_of(t: Any) -> tuple[int, ...]:
    """numpy order (outermost first) of a gguf reader tensor: GGUF lists dimensions innermost first."""
    return tuple(int(x) for x in reversed([int(d) for d in t.shape]))


def values(t: Any, file: str) -> np.ndarray:
    """float32, numpy-shaped, of one tensor of any type (module docstring)."""
    import gguf

    kind = t.tensor_type.name
    try:
        if kind == "BF16":   # the top 16 bits of a float32: widening is exact
            w = (np.ascontiguousarray(t.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
    except (NotImplementedError, ValueError) as exc:
        raise ModelError(f"{file}: tensor {t.name} has type {kind}, which ortserve cannot read ({exc})",
                         hint="convert the model with a float or a common quantized type (Q4_K, Q8_0, ...)") from exc
    return w.reshape(shape_of(t))


def _one(ws: list[np.ndarray]) -> np.ndarray:
    return ws[0]


def _rows(ws: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(ws, axis=0)


def _temporal(ws: list[np.ndarray]) -> np.ndarray:
    return np.stack(ws, axis=2)


def plan(text: Any, text_name: str, vision: Any, vision_name: str) -> list[Out]:
    """Every Hugging Face tensor of the pair, in file order; refuses a tensor the map lacks."""
    out = [Out(hf_name(t.name, text_name, TEXT), shape_of(t), [(t, text_name)], _one) for t in text.tensors]
    tensors = {t.name: t for t in vision.tensors}
    fused: dict[str, list[Any]] = {}
    for t in vision.tensors:
        m = re.fullmatch(r"v\.blk\.(\d+)\.(.+)", t.name)
        if m and re.fullmatch(r"attn_[qkv]\.(weight|bias)", m.group(2)):
            fused.setdefault(f"visual.blocks.{m.group(1)}.attn.qkv.{m.group(2).split('.')[1]}", []).append(t)
            continue
        if t.name in PATCH:
            if t.name == PATCH[0]:
                halves = [tensors.get(n) for n in PATCH]
                if halves[1] is None:
                    raise ModelError(f"{vision_name}: {PATCH[0]} has no temporal second half ({PATCH[1]})",
                                     hint="a Qwen2.5-VL mmproj carries both (temporal_patch_size 2)")
                shape = shape_of(t)
                out.append(Out("visual.patch_embed.proj.weight", (shape[0], shape[1], 2, *shape[2:]),
                               [(h, vision_name) for h in halves], _temporal))
            continue
        out.append(Out(hf_name(t.name, vision_name, VISION), shape_of(t), [(t, vision_name)], _one))
    for hf, parts in fused.items():
        by = {p.name.split(".")[3].removeprefix("attn_"): p for p in parts}   # v.blk.N.attn_q.weight -> q
        if sorted(by) != ["k", "q", "v"]:
            raise ModelError(f"{vision_name}: {hf} needs attn_q, attn_k and attn_v; the file has {sorted(by)}")
        shapes = [shape_of(by[k]) for k in "qkv"]
        out.append(Out(hf, (sum(s[0] for s in shapes), *shapes[0][1:]), [(by[k], vision_name) for k in "qkv"], _rows))
    have = {o.name for o in out}
    for need, file in (("model.embed_tokens.weight", text_name), ("visual.patch_embed.proj.weight", vision_name)):
        if need not in have:
            raise ModelError(f"{file} lacks {'token_embd.weight' if file == text_name else PATCH[0]}",
                             hint="a Qwen2.5-VL pair from llama.cpp's convert_hf_to_gguf.py has it")
    return out


def types(outs: list[Out]) -> dict[str, int]:
    """How many GGUF tensors of each type the pair has (for the manifest)."""
    return dict(Counter(t.tensor_type.name for o in outs for t, _ in o.parts))


def write_safetensors(outs: list[Out], path: Path, progress: Callable[[str], None] | None = None) -> None:
    """One float32 safetensors file, the header first (every shape is known from the GGUF headers),
    then each tensor as it is made: one tensor in memory at a time, whatever the model's size."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for o in outs:
        size = 4 * int(np.prod(o.shape, dtype=np.int64))
        header[o.name] = {"dtype": "F32", "shape": list(o.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for i, w in enumerate(made(outs)):
            f.write(np.ascontiguousarray(w, dtype="<f4").tobytes())
            if progress and i % 64 == 63:
                progress(f"wrote {i + 1} of {len(outs)} tensors")


def made(outs: list[Out]) -> Iterator[np.ndarray]:
    """Each planned tensor's float32 values, in order, checked against its planned shape."""
    for o in outs:
        w = o.join([values(t, file) for t, file in o.parts])
        if w.shape != o.shape:   # a file whose pieces disagree (a q of one width, a k of another)
            raise ModelError(f"{o.parts[0][1]}: {o.name} comes out {w.shape}, expected {o.shape}")
        yield w
