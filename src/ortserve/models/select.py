"""Hardware-aware selection: which installed variant of a model to load on a device.

    resolve(store, "smollm2-135m", "cpu")   -> Resolution(path, model_id, device, reason, variant)

Rules, in order:
1. a ref that is an existing directory is used as-is (the seed's GENAI_MODEL_DIR);
2. ``model:variant`` names one variant explicitly;
3. a model id or alias: among the variants built for ``device`` (``auto``: the first of
   cuda > dml > webgpu > cpu this machine can run; falling back to CPU
   variants, which every provider can run), take the fastest variant whose measured
   perplexity is within 1% of the fp32 reference; without speed measurements, take the
   device's preferred precision (CPU: the measured default int8; CUDA: fp16 then int4;
   DirectML/WebGPU: int4 then fp16), still skipping variants that miss the quality budget
   when a variant that meets it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ortserve.errors import ModelError, NotFound
from ortserve.models.catalog import CATALOG, DEFAULT_MODEL, DEFAULT_PRECISION
from ortserve.models.store import ModelStore, Variant

QUALITY_BUDGET_PCT = 1.0
PREFERRED_PRECISIONS: dict[str, tuple[str, ...]] = {
    "cpu": (DEFAULT_PRECISION, "fp32", "int4", "fp16"),
    "cuda": ("fp16", "int4", "int8", "fp32"),
    "dml": ("int4", "fp16", "int8", "fp32"),
    "webgpu": ("int4", "fp16", "int8", "fp32"),
}
# Devices without variants of their own run CPU builds.
_BUILD_DEVICE = {"openvino": "cpu", "directml": "dml", "gpu": "cuda"}


@dataclass(frozen=True)
class Resolution:
    path: Path                 # the directory to load (og.Model(path))
    model_id: str              # "model:variant", or the directory name for a path ref
    device: str                # the build device the choice was made for
    reason: str                # one sentence: why this variant
    variant: Variant | None    # None for a directory path


def build_device_for(device: str, have: dict[str, bool] | None = None) -> str:
    """The device whose variants to look for: ``auto`` means the best provider this machine has."""
    if device == "auto":
        from ortserve.engine.runtime import candidates

        device = candidates("auto", have)[0].device
    return _BUILD_DEVICE.get(device, device)


def resolve(store: ModelStore, ref: str | None, device: str = "cpu",
            have: dict[str, bool] | None = None) -> Resolution:
    """The best installed variant of ``ref`` for ``device`` (cpu, cuda, dml, webgpu, auto, openvino).

    ``have`` replaces the probe of this machine's providers (tests fake a GPU with it).
    """
    ref = (ref or DEFAULT_MODEL).strip()
    if not ref:   # Path("") is the current directory: never a model by accident
        raise NotFound("the model name is blank", param="model", hint="see `ortserve models list`")
    build_device = build_device_for(device, have)
    as_path = Path(ref).expanduser()
    if as_path.is_dir():
        return Resolution(as_path, as_path.name, build_device, f"{as_path} is a directory: used as-is", None)
    if any(sep in ref for sep in ("/", "\\")) or ref.startswith((".", "~")):
        raise ModelError(f"model directory {ref} does not exist",
                         hint="check the path, or give a model id from `ortserve models list`")
    if ":" in ref:
        v = store.get(ref)
        note = "" if v.device == build_device else f" (built for {v.device}, not {build_device})"
        return Resolution(v.model_dir, v.id, build_device, f"{v.id} was named explicitly{note}", v)
    candidates = variants_of(store, ref)
    if not candidates:
        hint = (f"run `ortserve models pull {ref}`" if ref in CATALOG
                else "see `ortserve models list`, or `ortserve models pull/import`")
        raise NotFound(f"model {ref!r} is not installed", param="model", hint=hint)
    v, reason = choose(candidates, build_device)
    return Resolution(v.model_dir, v.id, build_device, reason, v)


def variants_of(store: ModelStore, ref: str) -> list[Variant]:
    """All variants of the model ``ref`` names (by id or by an alias of one of its variants)."""
    hits = store.find(ref)
    models = {v.model for v in hits}
    return [v for v in store.variants() if v.model in models]


def _delta(v: Variant) -> float | None:
    d = v.quality.get("delta_pct")
    return float(d) if isinstance(d, (int, float)) else None


def _tps(v: Variant, device: str) -> float | None:
    t = v.speed.get("decode_tps")
    same_device = v.speed.get("device", v.device) == device
    return float(t) if isinstance(t, (int, float)) and t > 0 and same_device else None


def choose(candidates: list[Variant], device: str) -> tuple[Variant, str]:
    """Pick one variant for ``device`` and say why."""
    pool = [v for v in candidates if v.device == device]
    prefix = ""
    if not pool:
        pool = [v for v in candidates if v.device == "cpu"] or list(candidates)
        prefix = (f"no {device} variant installed (build one with `ortserve models convert "
                  f"{candidates[0].model} --device {device} --precision "
                  f"{PREFERRED_PRECISIONS.get(device, ('int4',))[0]}`); ")
        device = pool[0].device
    within = [v for v in pool if (d := _delta(v)) is not None and d <= QUALITY_BUDGET_PCT]
    timed = [v for v in within if _tps(v, device) is not None]
    if timed:
        best = max(timed, key=lambda v: _tps(v, device) or 0.0)
        reason = (f"{best.variant}: fastest {device} variant within {QUALITY_BUDGET_PCT:g}% of the fp32 "
                  f"perplexity ({_tps(best, device):g} tok/s, {_delta(best):+.2f}%)")
        faster = [v for v in pool if v not in within and (_tps(v, device) or 0) > (_tps(best, device) or 0)]
        if faster:
            f = max(faster, key=lambda v: _tps(v, device) or 0.0)
            d = _delta(f)
            reason += (f"; {f.variant} is faster ({_tps(f, device):g} tok/s) but "
                       + (f"{d:+.2f}% perplexity" if d is not None else "its quality is unmeasured"))
        return best, prefix + reason
    order = PREFERRED_PRECISIONS.get(device, PREFERRED_PRECISIONS["cpu"])
    ranked_pool = within or pool

    def rank(v: Variant) -> tuple[int, int, str]:
        return (order.index(v.precision) if v.precision in order else len(order), len(v.variant), v.variant)

    best = min(ranked_pool, key=rank)
    d = _delta(best)
    quality = (f", {d:+.2f}% perplexity vs fp32" if d is not None else ", quality not measured")
    basis = "within the quality budget" if within else "no variant has measured quality within budget"
    return best, prefix + (f"{best.variant}: preferred precision for {device} is "
                           f"{' > '.join(order)} ({basis}{quality}; no speed measurements to compare)")

