"""LoRA adapters: import a PEFT directory (or a llama.cpp LoRA GGUF) into the store, checked
against its base model.

A PEFT adapter is ``adapter_config.json`` + ``adapter_model.safetensors`` with, per targeted
module, ``...layers.{i}.{self_attn|mlp}.{module}.lora_A.weight`` ``[r, in]`` and ``lora_B``
``[out, r]``; the update is ``W += scale * B @ A`` with ``scale = lora_alpha / r`` (``/ sqrt(r)``
for rsLoRA). The store keeps it as numpy, in the engine's orientation (engine/lora.py):
``A = lora_A.T`` ``[in, r]`` and ``B = scale * lora_B.T`` ``[r, out]``, in ``adapter.npz``, with
``adapter.json`` and the store's manifest (SHA-256 of every file) like any variant. Reading
needs numpy and the ``safetensors`` package only: no torch, at import or at serve time.

Every check that can fail does so at import, naming what does not match: a module ortserve
cannot apply, a layer the base does not have, a shape that is not the base's (another
hidden size), a rank that is not the one adapter_config.json states.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ortserve import faults
from ortserve.engine.graph import load_decoder
from ortserve.engine.lora import MODULES, Adapter, find_targets
from ortserve.engine.runner import ModelSpec
from ortserve.errors import ModelError
from ortserve.models.store import ModelStore, Variant, validate_name

WEIGHTS, META = "adapter.npz", "adapter.json"
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class AdapterError(ModelError):
    """An adapter that does not fit its base model, or is not a LoRA ortserve can apply."""


def read_peft(path: Path, scale: float = 1.0) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """A PEFT LoRA directory as (adapter_config, {"layers.i.module": (A [in, r], scale * B [r, out])})."""
    path = Path(path)
    cfg_path, st_path = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not cfg_path.is_file() or not st_path.is_file():
        raise AdapterError(f"{path} is not a PEFT adapter directory (it needs adapter_config.json and "
                           "adapter_model.safetensors)", hint="save it with peft's model.save_pretrained(dir)")
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for flag, why in (("use_dora", "DoRA adapters"), ("fan_in_fan_out", "fan_in_fan_out (Conv1D) adapters")):
        if cfg.get(flag):
            raise AdapterError(f"{path}: {why} are not supported ({flag}=true)")
    if cfg.get("bias", "none") != "none":
        raise AdapterError(f"{path}: bias={cfg['bias']!r} is not supported (only bias='none')")
    if cfg.get("modules_to_save"):
        raise AdapterError(f"{path}: modules_to_save {cfg['modules_to_save']} (full weights, not LoRA) "
                           "are not supported")
    from safetensors.numpy import load_file

    tensors = load_file(str(st_path))
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        m = _KEY.search(key)
        if m is None or m.group(2) not in MODULES:
            raise AdapterError(f"{path}: target {key!r} is not a projection ortserve can apply "
                               f"(LoRA on {', '.join(MODULES)})")
        pairs.setdefault(f"layers.{m.group(1)}.{m.group(2)}", {})[m.group(3)] = value.astype(np.float32)
    if not pairs:
        raise AdapterError(f"{path}: adapter_model.safetensors holds no LoRA weights")
    r_cfg, alpha = int(cfg.get("r", 8)), float(cfg.get("lora_alpha", cfg.get("r", 8)))
    weights = {}
    for name, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{path}: {name} has lora_{''.join(ab)} but not both lora_A and lora_B")
        a, b = ab["A"], ab["B"]
        r = a.shape[0]
        want = _pattern(cfg.get("rank_pattern") or {}, name, r_cfg)
        if r != want or b.shape[1] != r:
            raise AdapterError(f"{path}: rank mismatch at {name}: adapter_config.json says r={want}, "
                               f"lora_A is {list(a.shape)} and lora_B {list(b.shape)}")
        a_alpha = _pattern(cfg.get("alpha_pattern") or {}, name, alpha)
        s = scale * (a_alpha / math.sqrt(r) if cfg.get("use_rslora") else a_alpha / r)
        weights[name] = (np.ascontiguousarray(a.T), np.ascontiguousarray(s * b.T))
    return cfg, weights


_GGUF_KEY = re.compile(r"^blk\.(\d+)\.(\w+)\.weight\.lora_([ab])$")
_GGUF_MODULES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
                 "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}


def read_gguf_lora(path: Path, scale: float, *, heads: int, kv_heads: int
                   ) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """A llama.cpp LoRA GGUF (``convert_lora_to_gguf.py`` output, float tensors) in the same form
    as ``read_peft``. llama.cpp stores q/k rows permuted for its rope layout (llama, mistral);
    the base graphs here are in Hugging Face order (models/gguf/reader.py un-permutes the base
    too), so lora_B's q/k rows are un-permuted with the base's head counts."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise AdapterError("reading a LoRA GGUF needs the gguf package", hint="pip install 'ortserve[convert]'") from exc

    from ortserve.models.gguf.reader import ARCHITECTURES

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:
        raise AdapterError(f"{path} is not a readable GGUF file: {exc}") from exc

    def field(name: str) -> Any:
        f = reader.fields.get(name)
        if f is None or not f.data:
            return None
        v = f.parts[f.data[0]]
        return bytes(v).decode() if v.dtype == np.uint8 else v.tolist()[0]

    if field("general.type") != "adapter" or field("adapter.type") != "lora":
        raise AdapterError(f"{path} is not a LoRA adapter GGUF (general.type={field('general.type')!r}, "
                           f"adapter.type={field('adapter.type')!r})")
    arch = field("general.architecture")
    alpha = float(field("adapter.lora.alpha") or 0.0)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for t in reader.tensors:
        m = _GGUF_KEY.match(t.name)
        if m is None or m.group(2) not in _GGUF_MODULES:
            raise AdapterError(f"{path}: tensor {t.name!r} is not a projection ortserve can apply "
                               f"(LoRA on {', '.join(_GGUF_MODULES)})")
        if t.tensor_type.name not in ("F32", "F16", "BF16"):
            raise AdapterError(f"{path}: {t.name} is {t.tensor_type.name}; convert with --outtype f32 or f16")
        data = np.asarray(t.data)
        data = (data.view(np.uint32) << 16).view(np.float32) if t.tensor_type.name == "BF16" else data
        pairs.setdefault(f"layers.{m.group(1)}.{_GGUF_MODULES[m.group(2)]}", {})[m.group(3).upper()] = \
            data.astype(np.float32).reshape([int(d) for d in reversed(t.shape)])
    weights = {}
    for name, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{path}: {name} has lora_{''.join(ab).lower()} but not both lora_a and lora_b")
        a, b = ab["A"], ab["B"]
        r = a.shape[0]
        if b.shape[1] != r:
            raise AdapterError(f"{path}: rank mismatch at {name}: lora_a is {list(a.shape)}, lora_b {list(b.shape)}")
        module = name.rsplit(".", 1)[1]
        if ARCHITECTURES.get(arch or "") and module in ("q_proj", "k_proj"):
            n = heads if module == "q_proj" else kv_heads
            b = b.reshape(n, b.shape[0] // n // 2, 2, r).swapaxes(1, 2).reshape(b.shape)
        s = scale * (alpha / r if alpha else 1.0)  # llama.cpp's rule: alpha 0 means scale 1
        weights[name] = (np.ascontiguousarray(a.T), np.ascontiguousarray(s * b.T))
    if not weights:
        raise AdapterError(f"{path} holds no LoRA tensors")
    return {"lora_alpha": alpha, "r": max(a.shape[1] for a, _ in weights.values()),
            "base_model_name_or_path": field("general.base_model.0.name"), "architecture": arch}, weights


def _pattern(patterns: dict[str, Any], name: str, default: Any) -> Any:
    """PEFT's rank_pattern/alpha_pattern: a key matching the end of the module's name wins."""
    module = name.split(".", 2)[-1]
    for key, value in patterns.items():
        if name.endswith(key) or re.search(rf"(^|\.){key}$", f"{name}") or key == module:
            return value
    return default


def check_against_base(weights: dict[str, tuple[np.ndarray, np.ndarray]], base_dir: Path) -> list[str]:
    """Raise AdapterError naming the first mismatch with the base model; the targets' names otherwise."""
    spec = ModelSpec.read(base_dir)
    proto = load_decoder(spec.onnx_path)
    if proto is None:
        raise AdapterError(f"cannot read the graph of {spec.onnx_path}")
    targets = find_targets(proto.graph, q_width=spec.heads * spec.head_size, kv_width=spec.kv_heads * spec.head_size)
    shapes = {}
    for t in targets:
        for module, width in t.parts:
            shapes[f"layers.{t.layer}.{module}"] = (t.inputs, width)
    for name, (a, b) in weights.items():
        layer = int(name.split(".")[1])
        if layer >= spec.layers:
            raise AdapterError(f"adapter targets {name}, but the base model has {spec.layers} layers")
        if name not in shapes:
            raise AdapterError(f"adapter targets {name}, which the base model's graph has no projection for")
        n_in, n_out = shapes[name]
        if a.shape[0] != n_in or b.shape[1] != n_out:
            raise AdapterError(f"shape mismatch at {name}: the adapter maps {a.shape[0]} -> {b.shape[1]} features, "
                               f"the base model's projection {n_in} -> {n_out} (another hidden size: was it "
                               "trained on a different base model?)")
    return sorted({n.split(".", 2)[2] for n in weights})


def import_adapter(store: ModelStore, path: Path, base: str, *, name: str | None = None,
                   scale: float = 1.0) -> Variant:
    """Check the PEFT adapter at ``path`` against the installed ``base`` and install it."""
    base_v = store.get(base)
    if base_v.kind != "chat":
        raise AdapterError(f"{base_v.id} is a {base_v.kind} model; adapters apply to chat models")
    name = validate_name(name or Path(path).resolve().name.lower().replace(" ", "-"), "adapter id")
    if Path(path).is_file():  # a llama.cpp LoRA GGUF
        spec = ModelSpec.read(base_v.model_dir)
        cfg, weights = read_gguf_lora(Path(path), scale, heads=spec.heads, kv_heads=spec.kv_heads)
    else:
        cfg, weights = read_peft(Path(path), scale)
    modules = check_against_base(weights, base_v.model_dir)

    def build(tmp: Path) -> dict[str, Any]:
        arrays = {}
        for key, (a, b) in weights.items():
            arrays[f"{key}.A"], arrays[f"{key}.B"] = a, b
        np.savez(tmp / WEIGHTS, **arrays)
        faults.point("adapter.written")
        meta = {"base": base_v.id, "rank": max(a.shape[1] for a, _ in weights.values()), "scale": scale,
                "target_modules": modules, "lora_alpha": cfg.get("lora_alpha"), "r": cfg.get("r"),
                "base_model_name_or_path": cfg.get("base_model_name_or_path")}
        (tmp / META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        return {"precision": "lora", "device": base_v.device, "source": str(Path(path).resolve()),
                "architecture": base_v.architecture, "context_length": base_v.context_length,
                "kind": "adapter", "base": base_v.id, "notes": meta}

    return store.install(name, "lora", build, replace=True)


def load_adapter(v: Variant) -> Adapter:
    """An installed adapter's weights, as the engine takes them (engine/lora.py)."""
    with np.load(v.path / WEIGHTS) as z:
        keys = sorted({k.rsplit(".", 1)[0] for k in z.files})
        weights = {k: (z[f"{k}.A"], z[f"{k}.B"]) for k in keys}
    return Adapter(name=v.model, weights=weights, meta=dict(v.notes))


def adapters_of(store: ModelStore, base: Variant) -> list[Variant]:
    """The installed adapters whose base is ``base``."""
    return [v for v in store.variants() if v.kind == "adapter" and v.base == base.id]
