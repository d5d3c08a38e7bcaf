"""Rope scaling of a llama/mistral/qwen2/qwen3 GGUF, read as llama.cpp reads it (issue 31).

llama.cpp (src/llama-model.cpp, llama-context.cpp, ggml-cpu/ops.cpp ``rope_yarn``) takes
``rope.scaling.type`` (default "linear") and a factor from ``rope.scaling.factor`` or the older
``rope.scale_linear`` (0 or absent: 1). For every rotary pair i at position p it rotates by

    theta = p * base**(-2i/d) / rope_freqs[i]                      (none; linear: / factor)
    theta = mix * theta_extrap + (1 - mix) * theta_extrap / factor  (yarn)

with YaRN's ramp ``mix`` between the correction dims of ``beta_fast`` 32 and ``beta_slow`` 1 over
``rope.scaling.original_context_length``, and cos/sin scaled by ``rope.scaling.attn_factor``
(whatever the type), times 1 + 0.1 ln(factor) for YaRN. Both are a per-pair divisor of the frequencies and one magnitude,
which is how the graph's cos/sin caches take them.
"""

from __future__ import annotations

import math

import numpy as np

from ortserve.errors import ModelError
from ortserve.models.gguf.reader import GGUFWeights, _field

ROPE_SCALINGS = ("none", "linear", "yarn")
BETA_FAST, BETA_SLOW = 32.0, 1.0


def rope_scaling(weights: GGUFWeights) -> str:
    """The file's rope.scaling.type, with llama.cpp's default."""
    return str(_field(weights.reader, f"{weights.arch}.rope.scaling.type", "linear"))


def scales_rope(weights: GGUFWeights) -> bool:
    """Whether the rotation differs from plain RoPE (beside Llama 3's rope_freqs)."""
    kind = rope_scaling(weights)
    return (kind not in ("none", "linear") or (kind == "linear" and _factor(weights) != 1.0)
            or _attn(weights) != 1.0)


def _attn(weights: GGUFWeights) -> float:
    """rope.scaling.attn_factor: llama.cpp scales cos/sin by it whatever the type."""
    return float(_field(weights.reader, f"{weights.arch}.rope.scaling.attn_factor", 1.0))


def _factor(weights: GGUFWeights) -> float:
    r, a = weights.reader, weights.arch
    factor = float(_field(r, f"{a}.rope.scaling.factor", 0.0) or _field(r, f"{a}.rope.scale_linear", 0.0) or 1.0)
    if not factor > 0:
        raise ModelError(f"{weights.path.name}: rope.scaling.factor {factor} is not positive")
    return factor


def rope_divisors(weights: GGUFWeights, rope_dim: int, theta: float) -> tuple[np.ndarray | None, float]:
    """(a divisor per rotary pair or None, the cos/sin magnitude) for the file's rope scaling;
    a type llama.cpp would read differently is refused before any output."""
    kind, a = rope_scaling(weights), weights.arch
    if kind not in ROPE_SCALINGS:
        raise ModelError(f"{weights.path.name}: rope.scaling.type {kind!r} is not supported by the streamed import "
                         f"of {a} (supported: {', '.join(ROPE_SCALINGS)}, and Llama 3's rope_freqs)")
    factor, attn = 1.0 if kind == "none" else _factor(weights), _attn(weights)
    if factor == 1.0:
        return None, attn
    if kind == "linear":
        return np.full(rope_dim // 2, factor, np.float32), attn
    r = weights.reader
    original = int(_field(r, f"{a}.rope.scaling.original_context_length", 0) or _field(r, f"{a}.context_length"))

    def corr_dim(beta: float) -> float:
        return rope_dim * math.log(original / (beta * 2 * math.pi)) / (2 * math.log(theta))

    low = max(0.0, math.floor(corr_dim(BETA_FAST)))
    high = min(rope_dim - 1.0, math.ceil(corr_dim(BETA_SLOW)))
    y = (np.arange(rope_dim // 2) - low) / max(0.001, high - low)
    mix = 1.0 - np.clip(y, 0.0, 1.0)              # 1: extrapolate (high frequencies), 0: interpolate
    magnitude = attn * (1.0 + 0.1 * math.log(factor)) if factor > 1.0 else attn
    return (1.0 / (mix + (1.0 - mix) / factor)).astype(np.float32), magnitude
