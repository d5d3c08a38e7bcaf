"""Hugging Face transformers on PyTorch (CPU, fp32), the baseline users start from.

Loads the Hugging Face copy of the model; for the default model that is the GGUF
dequantized by ortserve.models.convert.gguf_to_hf into a cache directory (done here, in the
benchmark's worker process, never in serving).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ortserve.bench.backends.base import Backend, FirstTokenClock, Spec, log_softmax_pick, perplexity_from
from ortserve.bench.measure import Timing, now
from ortserve.bench.workload import Prompt

WINDOW = 512


def ensure_hf_dir(spec: Spec) -> Path:
    hf = Path(spec.hf_dir or "")
    if (hf / "config.json").is_file():
        return hf
    gguf = spec.extra.get("gguf_for_hf")
    if not gguf:
        raise FileNotFoundError(f"no Hugging Face model at {hf} and no GGUF to make one from")
    from ortserve.models.convert import gguf_to_hf

    return gguf_to_hf(Path(gguf), hf)


class TransformersBackend(Backend):
    batches = True

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM

        if spec.threads:
            torch.set_num_threads(spec.threads)
        self.torch = torch
        self.dir = ensure_hf_dir(spec)
        self.model = AutoModelForCausalLM.from_pretrained(str(self.dir), dtype=torch.float32).eval()

    def run(self, prompts: list[Prompt], gen_tokens: int) -> list[Timing]:
        torch = self.torch
        width = min(len(p.ids) for p in prompts)  # equal lengths: no padding work
        ids = torch.tensor([p.ids[:width] for p in prompts], dtype=torch.long)
        t0 = now()
        clock = FirstTokenClock(t0)
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen_tokens,
                                      min_new_tokens=gen_tokens, do_sample=False, streamer=clock,
                                      pad_token_id=self.model.config.eos_token_id)
        end = now() - t0
        n = int(out.shape[1] - width)
        return [Timing(clock.first, end, n, width) for _ in prompts]

    def quality(self) -> dict[str, Any]:
        torch = self.torch
        ids: list[int] = self.spec.extra["heldout_ids"]
        out = []
        with torch.inference_mode():
            for start in range(0, len(ids) - 1, WINDOW):
                chunk = ids[start:start + WINDOW + 1]
                logits = self.model(torch.tensor([chunk[:-1]])).logits[0].float().numpy()
                out.extend(log_softmax_pick(logits, chunk[1:]))
        return perplexity_from(out, "perplexity (PyTorch fp32, dequantized GGUF)")

    def info(self) -> dict[str, Any]:
        import transformers

        return {"runtime": f"transformers {transformers.__version__}, torch {self.torch.__version__}",
                "threads": self.torch.get_num_threads(), "model": str(self.dir)}
