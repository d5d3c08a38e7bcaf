"""Image requests on og's generator one at a time (the first step of issue 42) against the same
requests as rows of ortserve's batched engine (docs/vision.md "Batched rows"), alternated.

    .venv/bin/python benchmarks/vision_rows.py STORE_MODEL_DIR [--requests 4] [--tokens 32] [--reps 3]

STORE_MODEL_DIR: an imported vision model (ortserve models import a Qwen2.5-VL directory; the test
session's random one lies under /tmp/pytest-of-*/pytest-current/vl-home0/models/). Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np


def png(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (56, 84, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


async def main(a: argparse.Namespace) -> dict[str, object]:
    from ortserve.server.vision_engine import VisionEngine
    from ortserve.types import SamplingParams
    from ortserve.vision.images import ImageInput, ImageLimits, decode
    from ortserve.vision.runner import MARKER, Sampling, VisionModel

    images = [ImageInput(png(s), "image") for s in range(a.requests)]
    messages = [{"role": "user", "content": MARKER + "What is in the image?"}]
    og = VisionModel(a.model)
    ve = VisionEngine("bench", a.model, SimpleNamespace(max_batch=max(8, a.requests), prefix_cache=False),
                      ThreadPoolExecutor(2))
    prompt = ve.codec.render_chat(messages)
    named = [og.inputs(prompt, [decode(i, ImageLimits())], ["image"]) for i in images]
    params = SamplingParams(temperature=0.0, max_tokens=a.tokens, ignore_eos=True)

    def one_at_a_time() -> tuple[float, int]:
        t, made = time.perf_counter(), 0
        for nm, n in named:
            made += sum(s.token is not None for s in og.run(nm, n, Sampling(max_tokens=a.tokens, temperature=0.0)))
        return time.perf_counter() - t, made

    async def batched() -> tuple[float, int]:
        t = time.perf_counter()
        handles = [await ve.submit(messages, [i], params, ImageLimits()) for i in images]
        made = 0
        for h in handles:
            async for ev in h:
                made += ev.metrics.output_tokens if ev.finished and ev.metrics else 0
        return time.perf_counter() - t, made

    await batched()   # warm: sessions, the encoder's cache
    reps = []
    for _ in range(a.reps):
        (t_og, n_og), (t_b, n_b) = one_at_a_time(), await batched()
        reps.append({"og_s": round(t_og, 3), "og_tokens": n_og, "batched_s": round(t_b, 3), "batched_tokens": n_b,
                     "og_tok_s": round(n_og / t_og, 1), "batched_tok_s": round(n_b / t_b, 1)})
    await ve.engine.stop()
    return {"model": str(a.model), "requests": a.requests, "tokens": a.tokens, "reps": reps,
            "widest_decode_step": ve.engine.core.runner.widest, "load": os.getloadavg()}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("model", type=Path)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    print(json.dumps(asyncio.run(main(p.parse_args())), indent=1))
