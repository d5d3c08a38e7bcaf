"""The decode step's fast paths (docs/native.md, the engine's per-step cost) decide exactly as the
general paths they skip: the runner's kept decode binding gives the logits of a step whose inputs
are bound afresh, and the sampler's plain greedy pick gives the token (and logprobs) the general
select gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ortserve.engine.runner import ModelSpec, Runner

PROMPTS = [[5, 17, 99, 3, 41, 8, 60], [7, 7, 12], [100, 2, 9, 31, 77, 4, 18, 22, 90, 11, 6]]


def _general_decode(runner: Runner, tokens: np.ndarray) -> np.ndarray:
    """A decode step as the runner did it before the kept binding: every input bound afresh."""
    n = len(tokens)
    lengths = runner.lengths[:n]
    total = int(lengths.max()) + 1
    runner.ensure_capacity(total)
    mask = (np.arange(total)[None, :] <= lengths[:, None]).astype(runner.mask_dtype)
    logits = runner._run(slice(0, n), tokens.reshape(n, 1), mask, np.arange(n), runner._logits[:, :n])
    lengths += 1
    return logits.astype(np.float32, copy=True)


def test_kept_decode_binding_gives_the_logits_of_a_fresh_one(tiny_model: Path) -> None:
    spec = ModelSpec.read(tiny_model)
    fast, general = Runner(spec, slots=4, capacity=16), Runner(spec, slots=4, capacity=16)
    for rows in (1, 3):
        tokens = []
        for row, ids in enumerate(PROMPTS[:rows]):  # rows of different lengths share each step
            a, b = fast.prefill(row, ids), general.prefill(row, ids)
            assert np.array_equal(a, b)
            tokens.append(int(np.argmax(a)))
        toks = np.asarray(tokens, dtype=np.int64)
        for _ in range(24):  # past capacity 16: the cache grows and the kept bindings are rebuilt
            got = fast.decode(toks).copy()
            want = _general_decode(general, toks)
            assert np.array_equal(got, want)
            toks = np.argmax(got, axis=1).astype(np.int64)
        assert np.array_equal(fast.lengths, general.lengths)
        assert fast.capacity > 16
        for row in range(rows):
            fast.clear(row)
            general.clear(row)
