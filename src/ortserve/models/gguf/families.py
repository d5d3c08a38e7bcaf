"""Phi-3/Phi-4-mini and Gemma 2/3 in the streamed exact GGUF import (issue 31).

``FamilyWriter`` is gguf_graph's Llama graph with each family's parts, read from the GGUF's
metadata and tensors in llama.cpp's own conventions (src/models/phi3.cpp, gemma2.cpp, gemma3.cpp):

- phi3: fused ``attn_qkv`` (packed q/k/v into GroupQueryAttention) and ``ffn_up`` (gate rows,
  then up rows); partial rotary (``rope.dimension_count`` < head size, Phi-4-mini: the cos/sin
  caches are rope_dim/2 wide); LongRoPE (``rope_factors_short``/``rope_factors_long``, both caches
  times ``rope.scaling.attn_factor``; the short ones while the sequence fits the original context,
  the long ones past it, as the ONNX Runtime GenAI builder switches them). llama.cpp disables
  Phi-3's sliding window, and so does this graph.
- gemma2/gemma3: embeddings times sqrt(d); RMS norms whose weights already hold Gemma's +1
  (llama.cpp's converter adds it); GELU-tanh MLP; post-attention and post-FFN norms; sliding-window
  layers (``attention.sliding_window``, pattern 2 for gemma2, 6 for gemma3, or the file's
  ``sliding_window_pattern``) on GroupQueryAttention's ``local_window_size``; attention soft-capping
  (gemma2, GQA ``softcap``) and final logit soft-capping; gemma3's q/k norms (gguf_graph's
  head_norm) and its two rope bases (``rope.freq_base_swa`` for local layers, ``rope.freq_base``
  and a linear ``rope.scaling.factor`` for global ones).

What a file asks for beyond this is refused before any tensor is decoded (``FamilySpec.of``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ortserve.errors import ModelError
from ortserve.models.gguf.graph import GraphWriter, Spec, rotary_caches
from ortserve.models.gguf.reader import GGUFWeights, _field
from ortserve.models.gguf.rope import rope_divisors
from ortserve.models.gguf.stream import vector

FAMILY_ARCHITECTURES = ("phi3", "gemma2", "gemma3")
ROPE_SCALING = ("none", "linear")     # rope.scaling.type values read (phi3's LongRoPE is its factor tensors)
SWA_PATTERN = {"gemma2": 2, "gemma3": 6}
BIG_GEMMA_LAYERS = {"gemma2": 46, "gemma3": 62}   # the 27B models: q scaled by (d/heads)^-0.5


@dataclass
class FamilySpec:
    """What a family adds to ``Spec``, from the GGUF's metadata (llama.cpp's defaults)."""

    gemma: bool
    attn_scale: float
    softcap: float                 # attention logits (gemma2), 0 = none
    final_softcap: float           # LM head logits, 0 = none
    window: int                    # sliding window in tokens, 0 = none
    swa: list[bool]                # per layer: sliding-window (local) attention
    theta_swa: float
    linear_scale: float            # global layers' positions are divided by it
    attn_factor: float             # cos/sin magnitude (LongRoPE)
    original_context: int
    long_factors: np.ndarray | None
    short_factors: np.ndarray | None

    @classmethod
    def of(cls, weights: GGUFWeights, spec: Spec) -> FamilySpec:
        r, a = weights.reader, spec.arch
        gemma = a.startswith("gemma")
        scaling = str(_field(r, f"{a}.rope.scaling.type", "none"))
        if scaling not in ROPE_SCALING:
            raise ModelError(f"{weights.path.name}: rope.scaling.type {scaling!r} is not supported by the streamed "
                             f"import of {a} (supported: {', '.join(ROPE_SCALING)}, and phi3's LongRoPE factors)")
        window = int(_field(r, f"{a}.attention.sliding_window", 4096 if a == "gemma2" else 0)) if gemma else 0
        swa = swa_layers(r, a, spec.layers) if window > 0 else [False] * spec.layers
        head_scale = spec.hidden // spec.heads if spec.layers == BIG_GEMMA_LAYERS.get(a) else spec.head_dim
        long_f, short_f = (vector(weights, f"rope_factors_{k}.weight") if f"rope_factors_{k}.weight" in weights.tensors
                           else None for k in ("long", "short"))
        if (long_f is None) != (short_f is None):
            raise ModelError(f"{weights.path.name}: LongRoPE needs both rope_factors_long and rope_factors_short")
        if long_f is not None and len(long_f) != spec.rope_dim // 2:
            raise ModelError(f"{weights.path.name}: {len(long_f)} rope factors for a rotary dimension of {spec.rope_dim}")
        if spec.rope_dim > spec.head_dim or spec.rope_dim % 2:
            raise ModelError(f"{weights.path.name}: rope.dimension_count {spec.rope_dim} does not fit "
                             f"head size {spec.head_dim}")
        factor = float(_field(r, f"{a}.rope.scaling.factor", 0.0)) if scaling == "linear" else 0.0
        return cls(gemma, 1.0 / math.sqrt(head_scale),
                   float(_field(r, f"{a}.attn_logit_softcapping", 50.0)) if a == "gemma2" else 0.0,
                   float(_field(r, f"{a}.final_logit_softcapping", 30.0 if a == "gemma2" else 0.0)) if gemma else 0.0,
                   window, swa,
                   float(_field(r, f"{a}.rope.freq_base_swa", spec.theta if a == "gemma2" else 10000.0)),
                   factor if factor > 0 else 1.0,
                   float(_field(r, f"{a}.rope.scaling.attn_factor", 1.0)),
                   int(_field(r, f"{a}.rope.scaling.original_context_length", spec.context)), long_f, short_f)


def swa_layers(reader: Any, arch: str, layers: int) -> list[bool]:
    """Which layers slide: the file's per-layer array, or every layer but each n-th (llama.cpp)."""
    f = reader.fields.get(f"{arch}.attention.sliding_window_pattern")
    if f is not None and f.types and f.types[0].name == "ARRAY":
        flags = [bool(f.parts[j][0]) for j in f.data]
        if len(flags) != layers:
            raise ModelError(f"sliding_window_pattern has {len(flags)} entries for {layers} layers")
        return flags
    n = int(f.parts[f.data[0]][0]) if f is not None else SWA_PATTERN[arch]
    return [n == 0 or i % n < n - 1 for i in range(layers)]


class FamilyWriter(GraphWriter):
    """gguf_graph.GraphWriter with the phi3 and gemma2/gemma3 parts (see the module doc)."""

    def __init__(self, weights: GGUFWeights, spec: Spec, data: Any) -> None:
        super().__init__(weights, spec, data)
        self.fam = FamilySpec.of(weights, spec)
        self.local: tuple[str, ...] = ()

    def caches_for(self, name: str, theta: float, rows: int, factors: np.ndarray | None,
                   mscale: float = 1.0) -> tuple[str, str]:
        cos, sin = rotary_caches(replace(self.spec, theta=theta, context=rows), factors)
        return self.init(f"cos_cache{name}", cos * np.float32(mscale)), self.init(f"sin_cache{name}", sin * np.float32(mscale))

    def rotary(self) -> None:
        f, s = self.fam, self.spec
        linear = np.full(s.rope_dim // 2, f.linear_scale, np.float32) if f.linear_scale != 1.0 else None
        if f.short_factors is None:
            self.cos_sin = self.caches_for("", s.theta, s.context, linear)
        elif s.context <= f.original_context:
            self.cos_sin = self.caches_for("", s.theta, s.context, f.short_factors, f.attn_factor)
        else:
            self.cos_sin = self.longrope_switch()
        if any(f.swa):
            self.local = self.caches_for("_local", f.theta_swa, s.context, None)

    def longrope_switch(self) -> tuple[str, str]:
        """cos/sin: the short-factor caches while the sequence fits the original context, the
        long-factor ones past it (an If on the attention mask's width, as the builder makes it)."""
        from onnx import TensorProto, helper

        f, s = self.fam, self.spec
        short = self.caches_for("_small", s.theta, f.original_context, f.short_factors, f.attn_factor)
        long = self.caches_for("_large", s.theta, s.context, f.long_factors, f.attn_factor)
        g = "/model/rope_caches_subgraph"
        shape = self.node("Shape", ["attention_mask"], f"{g}/Shape")[0]
        width = self.node("Gather", [shape, self.const(f"{g}/one", np.array(1, np.int64))], f"{g}/Gather", axis=0)[0]
        limit = self.const(f"{g}/original_context", np.array(f.original_context, np.int64))
        longer = self.node("Greater", [width, limit], f"{g}/Greater")[0]

        def branch(src: tuple[str, str], tag: str) -> Any:
            outs = [f"{n}_{tag}_out" for n in src]
            nodes = [helper.make_node("Identity", [n], [o], name=f"{g}/{tag}/{n}") for n, o in zip(src, outs)]
            vis = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None, s.rope_dim // 2]) for o in outs]
            return helper.make_graph(nodes, f"{tag}_rope_caches", [], vis)

        out = self.node("If", [longer], f"{g}/If", n_out=2, then_branch=branch(long, "large"),
                        else_branch=branch(short, "small"))
        return out[0], out[1]

    def caches(self, i: int) -> tuple[str, ...]:
        return self.local if self.fam.swa[i] and self.local else self.cos_sin

    def gqa_attrs(self, i: int) -> dict[str, Any]:
        f = self.fam
        # GQA's local_window_size masks keys as llama.cpp's n_swa does (checked by the tests)
        window = f.window if f.swa[i] else -1
        return {"scale": f.attn_scale, "local_window_size": window, "softcap": f.softcap}

    def qkv(self, i: int, x: str) -> list[str]:
        fused = f"blk.{i}.attn_qkv.weight"
        if fused not in self.w.tensors:
            return super().qkv(i, x)
        return [self.linear(x, (fused,), f"/model/layers.{i}/attn/qkv_proj")[0], "", ""]

    def mlp(self, i: int, x: str) -> str:
        p, m = f"blk.{i}", f"/model/layers.{i}/mlp"
        if f"{p}.ffn_gate.weight" in self.w.tensors:
            return super().mlp(i, x)
        # phi3: ffn_up holds the gate rows, then the up rows
        fused = self.linear(x, (f"{p}.ffn_up.weight",), f"{m}/gate_up_proj")[0]
        sizes = self.const(f"model.layers.{i}.mlp.gate_up_proj.gguf_split", np.array([self.spec.ffn] * 2, np.int64))
        gate, up = self.node("Split", [fused, sizes], f"{m}/gate_up_proj/gguf_split", n_out=2, axis=-1)
        h = self.node("Mul", [self.activation(gate, m), up], f"{m}/Mul")[0]
        return self.linear(h, (f"{p}.ffn_down.weight",), f"{m}/down_proj")[0]

    def activation(self, gate: str, m: str) -> str:
        if not self.fam.gemma:
            return super().activation(gate, m)
        return self.node("FastGelu", [gate], f"{m}/act_fn/FastGelu")[0]   # the tanh approximation

    def scale_embedding(self, x: str) -> str:
        if not self.fam.gemma:
            return x
        scale = self.const("model.embed_tokens.gguf_scale", np.array(math.sqrt(self.spec.hidden), np.float32))
        return self.node("Mul", [x, scale], "/model/embed_tokens/gguf_scale")[0]

    def post_norm(self, i: int, kind: str, x: str) -> str:
        gguf_name = f"blk.{i}.{'post_attention_norm' if kind == 'attn' else 'post_ffw_norm'}.weight"
        if gguf_name not in self.w.tensors:
            return x
        return self.norm(f"/model/layers.{i}/post_{kind}_norm", gguf_name, x, None)[0]

    def final_logits(self, logits: str) -> str:
        cap = self.fam.final_softcap
        if cap <= 0:
            return logits
        c = self.const("/model/lm_head/gguf_softcap", np.array(cap, np.float32))
        y = self.node("Div", [logits, c], "/model/lm_head/softcap/Div")[0]
        y = self.node("Tanh", [y], "/model/lm_head/softcap/Tanh")[0]
        return self.node("Mul", [y, c], "/model/lm_head/softcap/Mul")[0]


def refuse_unsupported(weights: GGUFWeights, spec: Spec) -> None:
    """Raise ModelError, in the header-reading time, for a family variant this graph does not write."""
    if spec.arch in FAMILY_ARCHITECTURES:
        FamilySpec.of(weights, spec)
    else:
        rope_divisors(weights, spec.rope_dim, spec.theta)


def writer_for(arch: str) -> type[GraphWriter]:
    return FamilyWriter if arch in FAMILY_ARCHITECTURES else GraphWriter


def genai_type(arch: str) -> str:
    """onnxruntime-genai's model type ("gemma3" there is the multimodal pipeline)."""
    return {"gemma3": "gemma3_text"}.get(arch, arch)
