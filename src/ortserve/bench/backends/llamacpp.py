"""llama.cpp through llama-cpp-python, on the GGUF the ONNX model was made from.

The high-level Llama API decodes one sequence, so this backend runs batch 1 only.
"""

from __future__ import annotations

import os
from typing import Any

from ortserve.bench.backends.base import Backend, Spec, log_softmax_pick, perplexity_from
from ortserve.bench.measure import Timing, now
from ortserve.bench.workload import Prompt

WINDOW = 512  # as ortserve.models.quality, so the perplexities compare


class LlamaCppBackend(Backend):
    batches = False

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        from llama_cpp import Llama

        if not spec.gguf:
            raise ValueError("llama.cpp needs a GGUF file")
        self.gguf: str = spec.gguf
        self.threads = spec.threads or os.cpu_count() or 1
        self.llm = Llama(model_path=self.gguf, n_ctx=spec.max_length, n_batch=512, n_threads=self.threads,
                         n_threads_batch=self.threads, verbose=False)

    def run(self, prompts: list[Prompt], gen_tokens: int) -> list[Timing]:
        if len(prompts) != 1:
            raise ValueError("llama-cpp-python's Llama decodes one sequence at a time")
        tokens = self.llm.tokenize(prompts[0].text.encode("utf-8"), add_bos=False, special=False)
        self.llm.reset()  # no prefix reuse from the previous run
        t0 = now()
        first, n = 0.0, 0
        # generate() never stops at EOS by itself: we stop after gen_tokens, like ignore_eos elsewhere.
        for _ in self.llm.generate(tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                   reset=True):
            n += 1
            if n == 1:
                first = now() - t0
            if n >= gen_tokens:
                break
        return [Timing(first, now() - t0, n, len(tokens))]

    def quality(self) -> dict[str, Any]:
        """Perplexity from llama.cpp's own logits (logits_all) on the held-out tokens, 512-token windows."""
        from llama_cpp import Llama

        ids: list[int] = self.spec.extra["heldout_ids"]
        scorer = Llama(model_path=self.gguf, n_ctx=WINDOW + 8, n_batch=WINDOW + 8, logits_all=True,
                       n_threads=self.threads, verbose=False)
        out = []
        for start in range(0, len(ids) - 1, WINDOW):
            chunk = ids[start:start + WINDOW + 1]
            scorer.reset()
            scorer.eval(chunk[:-1])
            out.extend(log_softmax_pick(scorer.scores[:len(chunk) - 1], chunk[1:]))
        del scorer
        return perplexity_from(out, "perplexity (llama.cpp logits, GGUF weights)")

    def info(self) -> dict[str, Any]:
        import llama_cpp

        return {"runtime": f"llama-cpp-python {llama_cpp.__version__}", "model": self.spec.gguf,
                "threads": self.threads}

    def close(self) -> None:
        self.llm.close()
