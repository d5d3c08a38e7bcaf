"""Run the workload on each backend in its own subprocess and gather comparable figures."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from ortserve.bench.measure import percentile
from ortserve.bench.workload import PromptSet, Workload, build_prompts

REFERENCE = "engine"
METRICS = ("ttft", "decode_tps", "latency", "throughput")


@dataclass(frozen=True)
class BackendInfo:
    name: str
    label: str
    target: str  # "module:Class" loaded by the worker
    needs: tuple[str, ...]  # modules the worker imports
    install: str  # the command that provides them
    source: str  # which copy of the model it runs: onnx, gguf or hf
    batches: bool = True  # runs batch sizes > 1
    own_venv: bool = False


BACKENDS: dict[str, BackendInfo] = {b.name: b for b in [
    BackendInfo("engine", "ortserve engine", "ortserve.bench.backends.onnx:EngineBackend",
                ("onnxruntime_genai",), "pip install ortserve", "onnx"),
    BackendInfo("server", "ortserve server (HTTP)", "ortserve.bench.backends.server:ServerBackend",
                ("onnxruntime_genai", "uvicorn", "httpx"), "pip install ortserve", "onnx"),
    BackendInfo("og", "raw og.Generator", "ortserve.bench.backends.onnx:OgBackend",
                ("onnxruntime_genai",), "pip install onnxruntime-genai", "onnx"),
    BackendInfo("llamacpp", "llama.cpp (llama-cpp-python)", "ortserve.bench.backends.llamacpp:LlamaCppBackend",
                ("llama_cpp",), "pip install llama-cpp-python", "gguf", batches=False),
    BackendInfo("transformers", "HF transformers (PyTorch)", "ortserve.bench.backends.hf:TransformersBackend",
                ("torch", "transformers"), "pip install 'ortserve[convert]'", "hf"),
    BackendInfo("optimum", "HF Optimum (ORTModelForCausalLM)", "ortserve.bench.backends.optimum:OptimumBackend",
                ("optimum.onnxruntime",), "", "hf", own_venv=True),
]}

Say = Callable[[str], None]


@dataclass
class Sources:
    """The same model in the three forms the backends read."""

    model_dir: Path
    gguf: Path | None = None
    hf_dir: Path | None = None
    hf_cache: Path | None = None  # where to dequantize the GGUF into a Hugging Face dir if hf_dir is None


def run_bench(sources: Sources, backends: list[str], workload: Workload, *, quality: bool = True,
              threads: int = 0, optimum_venv: Path = Path(".venv-optimum"), setup_optimum: bool = True,
              say: Say = lambda m: print(m, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Every backend's figures, skips and errors, plus the machine and workload, as one JSON-able dict."""
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(BACKENDS)}")
    context = context_length(sources.model_dir)
    work = workload.capped(context)
    dropped = sorted(set(workload.prompt_lengths) - set(work.prompt_lengths))
    from ortserve.models.quality import heldout_text

    tokenizer = sources.model_dir / "tokenizer.json"
    prompts = build_prompts(tokenizer, work, heldout_text(), max(work.batch_sizes, default=1))
    heldout_ids = _encode(tokenizer, heldout_text())
    results: dict[str, Any] = {
        "model": str(sources.model_dir), "gguf": str(sources.gguf or ""), "context_length": context,
        "workload": work.to_dict(), "dropped_prompt_lengths": dropped, "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "backends": [],
    }
    with tempfile.TemporaryDirectory(prefix="ortserve-bench-") as tmp:
        for name in backends:
            info = BACKENDS[name]
            row: dict[str, Any] = {"name": name, "label": info.label}
            python, why = _python_for(info, sources, optimum_venv, setup_optimum, say)
            if python is None:
                row.update(status="skipped", **why)
                say(f"{name}: skipped: {why['reason']} ({why['fix']})")
            else:
                row.update(_run_worker(info, python, sources, work, prompts, heldout_ids, quality, threads,
                                       Path(tmp), say))
            results["backends"].append(row)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results["machine"]["loadavg_end"] = _loadavg()
    add_stats(results)
    return results


def context_length(model_dir: Path) -> int:
    cfg = json.loads((Path(model_dir) / "genai_config.json").read_text(encoding="utf-8"))
    return int(cfg["model"].get("context_length") or 2048)


def _encode(tokenizer_json: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return list(Tokenizer.from_file(str(tokenizer_json)).encode(text, add_special_tokens=False).ids)


# ---- which python runs a backend, and why not --------------------------------------------------

def _python_for(info: BackendInfo, src: Sources, venv: Path, setup: bool,
                say: Say) -> tuple[str | None, dict[str, str]]:
    if info.own_venv:
        python = _optimum_python(venv, setup, say)
        if python is None:
            return None, {"reason": f"Optimum needs its own venv ({venv}): optimum-onnx pins transformers "
                          "4.57, which cannot read tokenizers saved by transformers 5",
                          "fix": optimum_setup_command(venv)}
    else:
        missing = [m for m in info.needs if not _has_module(m)]
        if missing:
            return None, {"reason": f"{', '.join(missing)} is not installed", "fix": info.install}
        python = sys.executable
    if info.source == "gguf" and src.gguf is None:
        return None, {"reason": "no GGUF of this model", "fix": "ortserve bench --gguf PATH"}
    if info.source == "hf" and src.hf_dir is None and (src.gguf is None or src.hf_cache is None):
        return None, {"reason": "no Hugging Face copy of this model", "fix": "ortserve bench --hf-dir PATH"}
    return python, {}


def _has_module(name: str) -> bool:
    try:
        return find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def optimum_setup_command(venv: Path) -> str:
    return (f"{sys.executable} -m venv {venv} && {_venv_python(venv)} -m pip install "
            "torch==2.13.0 'optimum-onnx[onnxruntime]'")


def _optimum_python(venv: Path, setup: bool, say: Say) -> str | None:
    python = _venv_python(venv)
    probe = [str(python), "-c", "import optimum.onnxruntime, transformers, torch"]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return str(python)
    if not setup:
        return None
    say(f"optimum: setting up {venv} (a few minutes): {optimum_setup_command(venv)}")
    ok = subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False).returncode == 0 and subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "torch==2.13.0", "optimum-onnx[onnxruntime]"], check=False
    ).returncode == 0
    return str(python) if ok and subprocess.run(probe, capture_output=True, check=False).returncode == 0 else None


# ---- one worker ------------------------------------------------------------------------------

def _run_worker(info: BackendInfo, python: str, src: Sources, work: Workload, prompts: PromptSet,
                heldout_ids: list[int], quality: bool, threads: int, tmp: Path, say: Say) -> dict[str, Any]:
    from ortserve.bench.backends.base import Spec

    cells = work.cells(batches=info.batches)
    max_batch = max((b for b, _ in cells), default=1)
    hf_dir = src.hf_dir or (src.hf_cache if info.source == "hf" else None)
    spec = Spec(model_dir=str(src.model_dir), gguf=str(src.gguf) if src.gguf else None,
                hf_dir=str(hf_dir) if hf_dir else None, max_batch=max_batch,
                max_length=max(work.prompt_lengths, default=0) + work.gen_tokens + 8, threads=threads,
                extra={"heldout_ids": heldout_ids, "gguf_for_hf": str(src.gguf) if src.gguf else None})
    job = {"backend": info.name, "target": info.target, "spec": spec.__dict__, "cells": cells,
           "workload": work.to_dict(), "prompts": prompts.to_json(), "quality": quality}
    job_path, out_path = tmp / f"{info.name}.job.json", tmp / f"{info.name}.out.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    env = dict(os.environ)
    if info.own_venv:  # a minimal copy of this package, so the venv never sees ortserve's dependencies
        env["PYTHONPATH"] = str(_stage_package(tmp))
    say(f"{info.name}: running in {'its own venv' if info.own_venv else 'a subprocess'}")
    load0 = _loadavg()
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-m", "ortserve.bench.worker", str(job_path), str(out_path)], env=env,
                          check=False)
    row: dict[str, Any] = {"wall_seconds": round(time.perf_counter() - t0, 1), "loadavg_start": load0,
                           "loadavg_end": _loadavg()}
    if not out_path.exists():
        return {**row, "status": "error", "reason": f"the worker exited with {proc.returncode} and no result",
                "fix": ""}
    result = json.loads(out_path.read_text(encoding="utf-8"))
    if result.get("error"):
        return {**row, **result, "status": "error", "reason": result["error"], "fix": ""}
    # A cell may have failed alone (e.g. out of memory at batch 16); the row is still "ok".
    return {**row, **result, "status": "ok"}


def _stage_package(tmp: Path) -> Path:
    root = tmp / "pkg"
    if root.exists():
        return root
    here = Path(__file__).parent
    files = ["__init__.py", "measure.py", "workload.py", "worker.py", "backends/__init__.py",
             "backends/base.py", "backends/optimum.py"]
    (root / "ortserve" / "bench" / "backends").mkdir(parents=True)
    (root / "ortserve" / "__init__.py").write_text("", encoding="utf-8")
    for f in files:
        shutil.copy(here / f, root / "ortserve" / "bench" / f)
    return root


# ---- machine and statistics ------------------------------------------------------------------

def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        import psutil  # type: ignore[import-untyped]

        ram = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        ram = None
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": ram, "os": platform.platform(),
            "python": platform.python_version(), "loadavg_start": _loadavg()}


def add_stats(results: dict[str, Any]) -> None:
    """Median and p90 of every figure per cell, and speed-up ratios against the engine's same cell."""
    for row in results["backends"]:
        for cell in row.get("cells", []):
            reps = cell.get("reps", [])
            cell["stats"] = {m: {"median": percentile([r[m] for r in reps], 50),
                                 "p90": percentile([r[m] for r in reps], 90)} for m in METRICS} if reps else {}
            if reps:
                cell["input_tokens"] = percentile([r["input_tokens"] for r in reps], 50)
                cell["output_tokens"] = percentile([r["output_tokens"] for r in reps], 50)
    ref = next((r for r in results["backends"] if r["name"] == REFERENCE and r.get("status") == "ok"), None)
    ref_cells = {(c["batch"], c["prompt_length"]): c for c in (ref or {}).get("cells", []) if c.get("stats")}
    for row in results["backends"]:
        for cell in row.get("cells", []):
            base = ref_cells.get((cell["batch"], cell["prompt_length"]))
            if not base or not cell.get("stats"):
                continue
            s, b = cell["stats"], base["stats"]
            # > 1 means the ortserve engine is faster, as in the ADR's "Speed Up ORT/x" columns.
            cell["engine_speedup"] = {
                "decode_tps": _ratio(b["decode_tps"]["median"], s["decode_tps"]["median"]),
                "throughput": _ratio(b["throughput"]["median"], s["throughput"]["median"]),
                "latency": _ratio(s["latency"]["median"], b["latency"]["median"]),
                "ttft": _ratio(s["ttft"]["median"], b["ttft"]["median"]),
            }


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None
