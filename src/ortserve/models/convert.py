"""Conversion: GGUF or Hugging Face directory -> ONNX Runtime GenAI model directory.

Heavy imports (torch, transformers) happen inside functions, and the builder runs in a
subprocess, so the serving process never loads PyTorch.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortserve.errors import DependencyMissing, ModelError
from ortserve.models.gguf_vocab import fit_tokenizer, keep_fim_ids
from ortserve.models.validate import gguf_metadata
from ortserve.models.winjob import kill_with_parent

PRECISIONS = ("fp32", "fp16", "int8", "int4")
BUILDER_DEVICES = ("cpu", "cuda", "dml", "webgpu")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "vocab.json", "merges.txt")
# Quantization options the builder accepts, by the names users see.
QUANT_OPTIONS = ("block_size", "algo_config", "matmul_mixed_precision", "accuracy_level",
                 "is_symmetric", "nodes_to_exclude")

Progress = Callable[[str], None]
log = logging.getLogger(__name__)


def _need_convert_deps() -> None:
    missing = []
    for mod in ("torch", "transformers", "onnx_ir"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise DependencyMissing(f"conversion needs {', '.join(missing)}",
                                hint="pip install 'ortserve[convert]'")


def gguf_to_hf(gguf_path: Path, out_dir: Path, progress: Progress | None = None) -> Path:
    """Dequantize a GGUF file into a Hugging Face directory (fp32 safetensors + tokenizer)."""
    _need_convert_deps()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    say = progress or (lambda _m: None)
    say(f"reading {gguf_path.name}")
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype="float32")
    except (ValueError, KeyError, OSError) as exc:
        raise ModelError(f"cannot read GGUF {gguf_path}: {exc}".splitlines()[0]) from exc
    # The weights arrive dequantized to fp32; drop the quantizer so they save as plain tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    say("writing Hugging Face weights")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    fit_tokenizer(out_dir, int(model.config.vocab_size))   # no id past the model's rows (issue 46)
    keep_fim_ids(gguf_metadata(gguf_path), out_dir)  # its fill-in-the-middle tokens, where the file names them
    return out_dir


def make_tiny_llama(out_dir: Path, tokenizer_dir: Path, *, layers: int = 2, hidden: int = 64,
                    seed: int = 0, max_positions: int = 2048) -> Path:
    """A random-weight Llama with a real tokenizer, for tests: same code path as real models."""
    _need_convert_deps()
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                      initializer_range=0.2,  # wide enough that greedy output varies
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return out_dir


def build_onnx(hf_dir: Path, out_dir: Path, *, precision: str = "int8", device: str = "cpu",
               options: dict[str, Any] | None = None, cache_dir: Path | None = None,
               progress: Progress | None = None) -> Path:
    """Run onnxruntime_genai.models.builder in a subprocess (its imports stay out of ours)."""
    if precision not in PRECISIONS:
        raise ModelError(f"unknown precision {precision!r}; choose {', '.join(PRECISIONS)}")
    if device not in BUILDER_DEVICES:
        raise ModelError(f"unknown build device {device!r}; choose {', '.join(BUILDER_DEVICES)}")
    _need_convert_deps()
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = cache_dir or out_dir.parent / f".{out_dir.name}.cache"
    cmd = [sys.executable, "-m", "ortserve.models.builder_child", str(os.getpid()),
           "-i", str(hf_dir), "-o", str(out_dir),
           "-p", precision, "-e", device, "-c", str(cache)]
    extra = {"hf_token": "false", **{k: v for k, v in (options or {}).items() if v is not None}}
    cmd += ["--extra_options", *(f"{k}={_opt(v)}" for k, v in extra.items())]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    say = progress or (lambda _m: None)
    say(f"building {precision} for {device}")
    t0 = time.monotonic()
    proc = run_builder(cmd, env)
    shutil.rmtree(cache, ignore_errors=True)
    if proc.returncode != 0:
        raise ModelError(f"model builder failed ({precision}/{device}, {exit_status(proc.returncode)}): "
                         f"{last_message(proc.stderr or proc.stdout)}")
    copy_tokenizer_files(hf_dir, out_dir)
    say(f"built in {time.monotonic() - t0:.1f}s")
    return out_dir


def run_builder(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the builder child in its own process group; on Windows also in a kill-on-close job."""
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8",
                          errors="replace", **own_process_group()) as child:
        job = None
        try:
            job = kill_with_parent(child._handle) if sys.platform == "win32" else None  # type: ignore[attr-defined]
        except OSError as exc:  # the child's own watchdog still ends it when the parent goes
            log.warning("%s", exc)
        try:
            out, err = child.communicate()
        finally:
            if job is not None:
                job.close()
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def exit_status(code: int) -> str:
    """'exit 1', or the signal that killed the child ('killed by SIGKILL': the OOM killer, a watchdog)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def last_message(output: str) -> str:
    """The builder's last line that is not a tqdm progress bar (those end its stderr)."""
    lines = [ln.strip() for ln in output.replace("\r", "\n").splitlines() if ln.strip()]
    told = [ln for ln in lines if "%|" not in ln and "it/s]" not in ln]
    return (told or lines or ["no output"])[-1]


def own_process_group() -> dict[str, Any]:
    """Popen arguments that put a child in its own process group (Ctrl-C goes to the parent only).

    The child still dies with its parent: ortserve.models.builder_child watches for that itself,
    and on Windows `run_builder` also puts it in a kill-on-close job (ortserve.models.winjob).
    """
    if os.name == "nt":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def _opt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Keep the model's own tokenizer and chat template next to the ONNX files."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and not (dst / name).is_file():
            shutil.copy2(src / name, dst / name)


def read_hf_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ModelError(f"{hf_dir} has no config.json: not a Hugging Face model directory")
    return json.loads(path.read_text(encoding="utf-8"))


def set_engine_batch(model_dir: Path, max_batch: int) -> None:
    """Record the static batch cap in genai_config.json (used by og.Engine if chosen)."""
    path = model_dir / "genai_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg.setdefault("engine", {}).setdefault("static_batching", {})["max_batch_size"] = max_batch
    path.write_text(json.dumps(cfg, indent=4), encoding="utf-8")
