"""Choosing and checking the GGUF-native graph of an exact import (models/gguf/native.py).

When ``native.plan()`` (gguf/native.py) says the library is usable, the exact import writes two graphs of
the file with the streamed writer: today's MatMulNBits graph in a work directory, whose
fp32-compute form (accuracy_level 0) is the dequantized fp32 reference, and the native graph in
the variant's directory. The native graph ships only if its logits on a short random input are as
close to that reference as the MatMulNBits graph's own int8-activation logits are (both quantize
activations to 8 bits per block; a kernel or layout error is orders of magnitude further off).
Otherwise the import falls back to today's graph and records why.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError
from ortserve.models.gguf.native import Plan, plan

LOGIT_TOL = 2e-3        # the exact path's fp32-compute tolerance: always allowed
SHIPPED_FACTOR = 2.0    # or up to this times the MatMulNBits graph's as-shipped error
N_TOKENS = 16
AGREEMENT_SLACK = 2 / N_TOKENS   # or its greedy picks agree with the reference as often, less two of 16


class NativeRefused(ModelError):
    """The native graph failed its check; the import goes on with today's graph."""


def logit_check(native_dir: Path, ref_dir: Path, seed: int = 0) -> dict[str, Any]:
    """Relative max logit errors against the fp32-compute reference of ``ref_dir``'s MatMulNBits
    graph: the native graph's, and the MatMulNBits graph's as shipped (int8 activations)."""
    import json

    from ortserve.models.gguf_check import logits, with_accuracy_level

    cfg = json.loads((native_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]
    dec = cfg["decoder"]
    ids = np.random.default_rng(seed).integers(0, cfg["vocab_size"], (1, N_TOKENS), dtype=np.int64)
    shape = (dec["num_key_value_heads"], dec["head_size"])
    fp32 = with_accuracy_level(ref_dir, 0)
    try:
        want = logits(fp32, ids, *shape)
    finally:
        fp32.unlink(missing_ok=True)
    shipped = logits(ref_dir / "model.onnx", ids, *shape)
    got = logits(native_dir / dec["filename"], ids, *shape)
    scale = max(float(np.abs(want).max()), 1e-30)
    native = float(np.abs(got - want).max() / scale) if np.isfinite(got).all() else float("inf")
    mnb = float(np.abs(shipped - want).max() / scale)
    limit = max(LOGIT_TOL, SHIPPED_FACTOR * mnb)
    agree, mnb_agree = (float((x.argmax(-1) == want.argmax(-1)).mean()) for x in (got, shipped))
    return {"native": native, "matmulnbits_shipped": mnb, "limit": limit, "argmax_agreement": agree,
            "matmulnbits_argmax_agreement": mnb_agree,
            "ok": bool(np.isfinite(native) and (native <= limit or agree >= mnb_agree - AGREEMENT_SLACK))}


def import_native(gguf: Path, out_dir: Path, work: Path, use: Plan, progress: Any = None,
                  reference: float | None = None) -> tuple[dict[str, Any], float]:
    """Write the native graph into ``out_dir`` and check it; returns (report, reference
    perplexity). Raises NativeRefused (``out_dir`` then holds a refused graph: clear it)."""
    from ortserve.models.gguf.fast import fp32_compute_perplexity, import_gguf_streamed

    say = progress or (lambda _m: None)
    ref_dir = work / "matmulnbits"
    ref_dir.mkdir(parents=True, exist_ok=True)
    say("writing the MatMulNBits graph (the native graph's fp32 reference)")
    base = import_gguf_streamed(gguf, ref_dir, progress=progress, smoke=False)
    say(f"writing the GGUF-native graph ({use.isa or 'native kernels'})")
    try:   # whatever refuses the file itself was raised by the MatMulNBits write above
        report = import_gguf_streamed(gguf, out_dir, progress=progress, smoke=False, native=use,
                                      tokenizer_from=(ref_dir, base["tokenizer_files"]))
    except (ModelError, OSError, ValueError) as exc:
        raise NativeRefused(f"the native graph could not be written: {str(exc).splitlines()[0]}") from exc
    if report["kernels"] != "gguf-native":
        raise NativeRefused("the native library reads none of this file's block types")
    try:
        check = logit_check(out_dir, ref_dir)
    except Exception as exc:   # any failure to run the native graph refuses it
        raise NativeRefused(f"the native graph did not run: {str(exc).splitlines()[0]}") from exc
    report["logit_error"] = check
    report["matmulnbits_weight_bytes_per_token"] = base["weight_bytes_per_token"]
    if not check["ok"]:
        raise NativeRefused(f"native logits differ from the fp32 reference by {check['native']:.3g} (relative; "
                            f"limit {check['limit']:.3g}, MatMulNBits as shipped {check['matmulnbits_shipped']:.3g})")
    say(f"native: logits {check['native']:.2g} from the fp32 reference "
        f"(MatMulNBits as shipped {check['matmulnbits_shipped']:.2g}); "
        f"{report['weight_bytes_per_token'] / 1e6:.1f} MB of weights per token "
        f"(MatMulNBits {base['weight_bytes_per_token'] / 1e6:.1f})")
    ref = reference if reference is not None else fp32_compute_perplexity(ref_dir)
    return report, ref


def try_native(gguf: Path, tmp: Path, progress: Any = None,
               reference: float | None = None) -> tuple[dict[str, Any] | None, float | None, dict[str, str]]:
    """(report, reference perplexity, {}) for a checked native graph in ``tmp``, or (None, None,
    {"native_off" or "native_refused": why}) with ``tmp`` emptied for today's graph."""
    use = plan()
    if not use.use:
        return None, None, {"native_off": use.reason}
    work = tmp.with_name(tmp.name + ".native")
    try:
        report, ref = import_native(gguf, tmp, work, use, progress, reference)
        return report, ref, {}
    except NativeRefused as exc:
        if progress:
            progress(f"{exc}; using the MatMulNBits graph")
        for f in tmp.iterdir():
            shutil.rmtree(f) if f.is_dir() else f.unlink()
        return None, None, {"native_refused": str(exc)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def kernels_stale(notes: dict[str, Any]) -> str | None:
    """Why an exact variant's kernels no longer fit this install (the native library came or
    went, or was switched), or None. A variant whose native graph was refused is kept."""
    kernels = notes.get("kernels", "matmulnbits")
    if kernels == "matmulnbits" and notes.get("native_refused"):
        return None
    use = plan().use
    if use and kernels != "gguf-native":
        return "the GGUF-native kernels are available"
    if not use and kernels == "gguf-native":
        return "the GGUF-native kernels are off or unavailable"
    return None
