"""Hugging Face Optimum: ORTModelForCausalLM on an fp32 ONNX export of the Hugging Face model.

Runs in its own venv (optimum-onnx pins transformers 4.57), so it takes token ids, never a
tokenizer, and imports nothing from ortserve beyond this package's stdlib-only modules.
The export is cached next to the Hugging Face directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ortserve.bench.backends.base import Backend, FirstTokenClock, Spec, log_softmax_pick, perplexity_from
from ortserve.bench.measure import Timing, now
from ortserve.bench.workload import Prompt

WINDOW = 512


def _rope(model_dir: Path) -> object:
    try:
        return json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("rope_theta")
    except (OSError, ValueError):
        return None


def v4_source(hf_dir: Path) -> Path:
    """The Hugging Face dir as transformers 4.x reads it.

    transformers 5 saves RoPE settings under ``rope_parameters`` and leaves a stale top-level
    ``rope_theta`` (10000) that 4.x would use: SmolLM2's is 100000, so an export from the
    saved config computes wrong positions (perplexity 24.5 instead of 22.6). This writes a
    config with the real values next to links to the weights.
    """
    cfg = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" not in rope:
        return hf_dir
    cfg["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    out = Path(str(hf_dir).rstrip("/") + "-transformers4")
    out.mkdir(exist_ok=True)
    for f in hf_dir.iterdir():
        link = out / f.name
        if f.name != "config.json" and f.is_file() and not link.exists():
            link.symlink_to(f.resolve())
    (out / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return out


class OptimumBackend(Backend):
    batches = True

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from optimum.onnxruntime import ORTModelForCausalLM  # type: ignore[import-not-found]

        if not spec.hf_dir or not (Path(spec.hf_dir) / "config.json").is_file():
            raise FileNotFoundError(f"no Hugging Face model at {spec.hf_dir}")
        self.torch = torch
        source = v4_source(Path(spec.hf_dir))
        self.export = Path(str(spec.hf_dir).rstrip("/") + "-optimum-onnx")
        if _rope(self.export) != _rope(source) or not (self.export / "model.onnx").is_file():
            model = ORTModelForCausalLM.from_pretrained(str(source), export=True, use_cache=True)
            model.save_pretrained(str(self.export))
            del model
        import onnxruntime  # type: ignore[import-untyped]

        so = onnxruntime.SessionOptions()
        if spec.threads:
            so.intra_op_num_threads = spec.threads
        self.model = ORTModelForCausalLM.from_pretrained(str(self.export), use_cache=True, session_options=so)

    def run(self, prompts: list[Prompt], gen_tokens: int) -> list[Timing]:
        torch = self.torch
        width = min(len(p.ids) for p in prompts)
        ids = torch.tensor([p.ids[:width] for p in prompts], dtype=torch.long)
        t0 = now()
        clock = FirstTokenClock(t0)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen_tokens,
                                  min_new_tokens=gen_tokens, do_sample=False, streamer=clock,
                                  pad_token_id=self.model.config.eos_token_id)
        end = now() - t0
        return [Timing(clock.first, end, int(out.shape[1] - width), width) for _ in prompts]

    def quality(self) -> dict[str, Any]:
        torch = self.torch
        ids: list[int] = self.spec.extra["heldout_ids"]
        out = []
        for start in range(0, len(ids) - 1, WINDOW):
            chunk = ids[start:start + WINDOW + 1]
            x = torch.tensor([chunk[:-1]])
            logits = self.model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0].float().numpy()
            out.extend(log_softmax_pick(logits, chunk[1:]))
        return perplexity_from(out, "perplexity (Optimum fp32 ONNX export)")

    def info(self) -> dict[str, Any]:
        from importlib.metadata import version

        import onnxruntime  # type: ignore[import-untyped]
        import transformers

        return {"runtime": f"optimum-onnx {version('optimum-onnx')}, onnxruntime {onnxruntime.__version__}, "
                           f"transformers {transformers.__version__}", "model": str(self.export)}
