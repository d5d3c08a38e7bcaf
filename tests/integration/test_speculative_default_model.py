"""Speculation on the real default model (SmolLM2-135M) over copy-heavy prompts: greedy tokens are the
same with it on and off, and guesses are accepted. The model as stored computes its MatMulNBits at
accuracy_level 4, whose results move with the number of rows in a step (docs/prefix_cache.md,
"Exactness"); a verify step has k+1 rows, so exactness is tested on a copy at accuracy_level 0, as
benchmarks/split_invariance.py does (docs/speculative.md, "Exactness")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.models.gguf_check import with_accuracy_level
from ortserve.types import SamplingParams

PASSAGE = ("The warranty covers defects in materials and workmanship for two years from the date of purchase. "
           "It does not cover damage caused by limescale or by dropping the kettle.")
PROMPTS = [[{"role": "system", "content": f"Answer by quoting this passage word for word.\n\n{PASSAGE}"},
            {"role": "user", "content": "What does the warranty cover? Quote the passage."}],
           [{"role": "user", "content": 'Return this JSON with city set to "Paris", JSON only: '
                                        '{"id": 4812, "name": "Ada Lovelace", "city": "London", "seats": 12}'}]]


@pytest.fixture(scope="module")
def level0(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortserve.engine.runtime import custom_ops_library

    dst = tmp_path_factory.mktemp("smollm2-level0")
    src = default_model
    # the GGUF-native graph has no fp32-compute form (its int8 activations move with the rows too):
    # the same file's MatMulNBits graph has
    if custom_ops_library(default_model) is not None:
        from ortserve.models.catalog import embedded_gguf
        from ortserve.models.gguf.fast import import_gguf_streamed

        src = tmp_path_factory.mktemp("smollm2-matmulnbits") / "model"
        import_gguf_streamed(embedded_gguf(), src, smoke=False)
    return with_accuracy_level(src, 0, out_dir=dst).parent


def test_greedy_tokens_match_with_speculation_on_and_off_and_guesses_are_accepted(level0: Path) -> None:
    eng = AsyncEngine.load(level0, load_settings(max_batch=2, prefix_cache=False))
    eng.core.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=28)
        for messages in PROMPTS:
            out = {}
            for on in (True, False):
                eng.core.speculative = on
                out[on] = asyncio.run(eng.generate(messages=messages, params=params))
            assert out[True].text == out[False].text
            spec = out[True].metrics.speculative
            assert spec["accepted"] > 0, spec
    finally:
        eng.core.stop()


def test_the_default_model_as_its_own_draft_gives_the_same_tokens_and_is_always_accepted(level0: Path) -> None:
    """Draft-model speculation (engine/speculation/draft.py) with the target as its draft: at accuracy_level 0 the
    draft's one-row steps and the verify step agree exactly, so every guess holds."""
    eng = AsyncEngine.load(level0, load_settings(max_batch=2, prefix_cache=False, speculative_lookup=False),
                           draft=(level0, "smollm2-level0"))
    eng.core.start()
    try:
        messages = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        on = asyncio.run(eng.generate(messages=messages, params=params))
        eng.core.speculative = False
        off = asyncio.run(eng.generate(messages=messages, params=params))
        assert on.text == off.text
        draft = on.metrics.speculative["draft"]
        assert draft["proposed"] >= 16 and draft["acceptance"] == 1.0, draft
    finally:
        eng.core.stop()
