"""Does splitting a prompt into steps change greedy tokens? (docs/prefix_cache.md, "Exactness"); prints JSON.

    .venv/bin/python benchmarks/split_invariance.py [--model smollm2-135m]

The same 300-token system prompt and question, greedy, 8 tokens, three ways: one 512-token
prefill with no cache, 64-token chunks with no cache, and a second request that starts from the
first one's cached KV. Run once on the model as stored and once on a copy whose MatMulNBits
compute at accuracy_level 0 (fp32 activations; the copy goes to a temporary directory).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from _common import emit, machine, model_dir

from ortserve.config import load_settings
from ortserve.engine import LLM
from ortserve.models.gguf_check import with_accuracy_level
from ortserve.types import SamplingParams

SYSTEM = "You are a careful assistant for a hardware store. " * 30
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Do you sell hammers?"}]


def answers(path: Path) -> dict[str, str]:
    params = SamplingParams(temperature=0, max_tokens=8)
    out = {}
    for name, chunk, cache in (("prefill_512", 512, False), ("chunks_64", 64, False), ("cached", 512, True)):
        with LLM(path, settings=load_settings(prefill_chunk=chunk, prefix_cache=cache)) as llm:
            first = llm.generate([MESSAGES], params)[0].text
            out[name] = llm.generate([MESSAGES], params)[0].text if cache else first
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    path, model_id = model_dir(args.model)
    result: dict[str, Any] = {"machine": machine(), "model": model_id, "as_stored": answers(path)}
    with tempfile.TemporaryDirectory() as tmp:
        result["accuracy_level_0"] = answers(with_accuracy_level(path, 0, out_dir=Path(tmp)).parent)
    for k in ("as_stored", "accuracy_level_0"):
        result[k + "_split_invariant"] = len(set(result[k].values())) == 1
    emit(result)


if __name__ == "__main__":
    main()
