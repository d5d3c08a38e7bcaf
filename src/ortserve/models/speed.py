"""Decode speed of one model directory: single stream, greedy, through og.Generator.

Recorded in each CPU variant's manifest so selection can prefer the fastest variant
that keeps quality; benchmarks/variants.py uses the same function for the README table.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ortserve.errors import require_genai

PROMPT = "The history of the printing press begins"


def decode_tps(model_dir: Path, tokens: int = 64, repeats: int = 2, device: str = "cpu") -> dict[str, Any]:
    """Best-of-``repeats`` decode tokens/s after a warm-up run (prefill excluded)."""
    og = require_genai()
    config = og.Config(str(model_dir))
    if device == "cpu":
        config.clear_providers()
    model = og.Model(config)
    tok = og.Tokenizer(model)
    prompt = tok.encode(PROMPT)
    best = 0.0
    for i in range(repeats + 1):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + tokens + 1, min_length=len(prompt) + tokens,
                                  do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(prompt)  # prefill
        gen.generate_next_token()
        t0, n = time.perf_counter(), 0
        while not gen.is_done() and n < tokens:
            gen.generate_next_token()
            n += 1
        elapsed = time.perf_counter() - t0
        if i > 0 and n and elapsed > 0:  # run 0 warms up
            best = max(best, n / elapsed)
        del gen
    return {"decode_tps": round(best, 1), "tokens": tokens, "device": device}
