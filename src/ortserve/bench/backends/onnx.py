"""The three ONNX Runtime GenAI backends: ortserve's engine, ortserve's server, raw og.Generator."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from ortserve.bench.backends.base import Backend, Spec
from ortserve.bench.measure import Timing, now
from ortserve.bench.workload import Prompt


def onnx_quality(model_dir: str) -> dict[str, Any]:
    from ortserve.models.quality import perplexity

    return {**perplexity(Path(model_dir)), "method": "perplexity (ONNX graph, onnxruntime)"}


def onnx_settings(spec: Spec) -> Any:
    from ortserve.config import load_settings

    return load_settings(max_batch=max(spec.max_batch, 1), intra_op_threads=spec.threads or None,
                         telemetry=False)


class EngineBackend(Backend):
    """ortserve's AsyncEngine in-process: continuous batching, the same path the server uses."""

    batches = True

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        from ortserve.engine import AsyncEngine

        self.loop = asyncio.new_event_loop()
        self.engine = AsyncEngine.load(Path(spec.model_dir), onnx_settings(spec))
        self.loop.run_until_complete(self.engine.start())

    def run(self, prompts: list[Prompt], gen_tokens: int) -> list[Timing]:
        return self.loop.run_until_complete(self._batch(prompts, gen_tokens))

    async def _batch(self, prompts: list[Prompt], gen_tokens: int) -> list[Timing]:
        from ortserve.types import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=gen_tokens, ignore_eos=True)
        t0 = now()
        handles = [self.engine.submit(prompt=p.text, params=params) for p in prompts]
        return list(await asyncio.gather(*(self._collect(h, t0) for h in handles)))

    @staticmethod
    async def _collect(handle: Any, t0: float) -> Timing:
        first: float | None = None
        async for ev in handle:
            if first is None:
                first = now() - t0
            if ev.finished:
                if ev.finish_reason == "error":
                    raise RuntimeError(ev.error or "generation failed")
                tokens = ev.metrics.output_tokens if ev.metrics else 0
                return Timing(first, now() - t0, tokens, handle.input_tokens)
        raise RuntimeError("stream ended without a final event")

    def quality(self) -> dict[str, Any]:
        return onnx_quality(self.spec.model_dir)

    def info(self) -> dict[str, Any]:
        import onnxruntime_genai as og  # type: ignore[import-untyped]

        return {"runtime": f"onnxruntime-genai {og.__version__}", "device": self.engine.device,
                "model": self.spec.model_dir}

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.stop())
        self.loop.close()


class OgBackend(Backend):
    """og.Generator with no scheduler: one static batch, the floor ortserve's overhead is measured from."""

    batches = True

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        import onnxruntime_genai as og  # type: ignore[import-untyped]

        self.og = og
        config = og.Config(spec.model_dir)
        config.clear_providers()  # CPU, like the engine's default on this machine
        if spec.threads:
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {
                "intra_op_num_threads": spec.threads}}}}))
        self.model = og.Model(config)

    def run(self, prompts: list[Prompt], gen_tokens: int) -> list[Timing]:
        import numpy as np

        og, b = self.og, len(prompts)
        width = max(len(p.ids) for p in prompts)
        if any(len(p.ids) != width for p in prompts):  # og batches need equal lengths; left-pad would add work
            prompts = [Prompt(p.ids[:min(len(q.ids) for q in prompts)], p.text) for p in prompts]
            width = len(prompts[0].ids)
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=width + gen_tokens, min_length=width + gen_tokens,
                                  batch_size=b, do_sample=False)
        t0 = now()
        gen = og.Generator(self.model, params)
        gen.append_tokens(np.array([p.ids for p in prompts], dtype=np.int32))  # once: prefill the batch
        first = 0.0
        n = 0
        while n < gen_tokens and not gen.is_done():
            gen.generate_next_token()
            gen.get_next_tokens()
            n += 1
            if n == 1:
                first = now() - t0
        end = now() - t0
        del gen
        return [Timing(first, end, n, width) for _ in prompts]

    def quality(self) -> dict[str, Any]:
        return onnx_quality(self.spec.model_dir)

    def info(self) -> dict[str, Any]:
        return {"runtime": f"onnxruntime-genai {self.og.__version__}", "device": "cpu",
                "model": self.spec.model_dir}
