"""The default model's weights in transparent huge pages (issue 22): the greedy tokens do not
change, and the prepacked weights are what gets advised."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ortserve.engine.runner import ModelSpec, Runner
from ortserve.engine.runtime import thp_enabled


def _greedy(runner: Runner, ids: list[int], n: int) -> list[int]:
    tok = int(np.argmax(runner.prefill(0, ids)))
    out = [tok]
    for _ in range(n - 1):
        tok = int(np.argmax(runner.decode(np.array([tok], dtype=np.int64))[0]))
        out.append(tok)
    runner.clear(0)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux") or not thp_enabled(), reason="no transparent huge pages here")
def test_default_model_weights_in_huge_pages_give_the_same_greedy_tokens(default_model: Path) -> None:
    spec = ModelSpec.read(default_model)
    plain = Runner(spec, slots=1, huge_pages=False)
    huge = Runner(spec, slots=1)
    assert plain.huge_page_bytes == 0
    # the prepacked 4-bit weights, minimum terms and 8-bit LM head are ~110 MB
    assert huge.huge_page_bytes > 64 << 20
    ids = list(range(200, 240))
    assert _greedy(huge, ids, 24) == _greedy(plain, ids, 24)
