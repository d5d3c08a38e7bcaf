"""Decode speed of one model directory: single stream, greedy, through ortserve's own runner.

Measured with the code path that serves requests (engine/runner.py), so the number in each
variant's manifest, the selection that uses it and benchmarks/variants.py's README table
all describe what `ortserve serve` will actually do.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

PROMPT = "The history of the printing press begins"


def decode_tps(model_dir: Path, tokens: int = 64, repeats: int = 2, device: str = "cpu") -> dict[str, Any]:
    """Best-of-``repeats`` decode tokens/s after a warm-up run (prefill excluded)."""
    from ortserve.config import load_settings
    from ortserve.engine.runner import ModelSpec, Runner
    from ortserve.engine.runtime import PROVIDERS, session_options
    from ortserve.engine.tokenizer import TextCodec

    spec = ModelSpec.read(Path(model_dir))
    runner = Runner(spec, slots=1, capacity=128, providers=[PROVIDERS.get(device, "CPUExecutionProvider")],
                    session_options=session_options(load_settings()))
    prompt = TextCodec(Path(model_dir)).encode(PROMPT)
    best = 0.0
    for i in range(repeats + 1):
        token = int(np.argmax(runner.prefill(0, prompt)))
        t0 = time.perf_counter()
        for _ in range(tokens):
            token = int(np.argmax(runner.decode(np.array([token]))[0]))
        elapsed = time.perf_counter() - t0
        runner.clear(0)
        if i > 0 and elapsed > 0:  # run 0 warms up
            best = max(best, tokens / elapsed)
    return {"decode_tps": round(best, 1), "tokens": tokens, "device": device}
