"""The plain greedy pick (engine/postprocess.py ``select`` on a ``Sequence.plain_greedy`` row: no
copy of the logits row) takes the token the general path takes, on rows built to catch it out:
an EOS at the maximum with EOS suppressed (ignore_eos, min_tokens), ties, -inf and NaN entries."""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.engine.detokenize import IncrementalDetokenizer
from ortserve.engine.postprocess import Postprocess
from ortserve.engine.sequence import Sequence
from ortserve.types import SamplingParams

EOS = {2, 7}
VOCAB = 16


class _Core(Postprocess):
    def __init__(self) -> None:
        self.eos = set(EOS)


def _seq(outputs: int = 0, **kw: object) -> Sequence:
    params = SamplingParams(**{"temperature": 0, **kw})  # type: ignore[arg-type]
    seq = Sequence(id="r", prompt_ids=[0, 1], params=params,
                   sink=lambda ev: None, detok=IncrementalDetokenizer(lambda ids: ""), model="m")
    seq.output_ids = [3] * outputs
    return seq


def _rows() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    rows = [rng.normal(size=VOCAB).astype(np.float32) for _ in range(200)]
    for i, r in enumerate(rows[:120]):   # an EOS is the maximum (or ties it) in most of them
        eos = sorted(EOS)[i % 2]
        r[eos] = r.max() + (0.0 if i % 3 == 0 else 1.0)
        if i % 5 == 0:
            r[i % VOCAB] = r[eos]          # a tie with a non-EOS token, before or after it
    rows[120][:] = -np.inf
    rows[121][:] = -np.inf
    rows[121][4] = 0.0
    rows[122][9] = np.nan
    rows[123][2] = np.nan
    rows[124][:] = 1.0                 # all equal: the first index wins, and EOS 2 is not first
    return rows


@pytest.mark.parametrize("kw,outputs", [({}, 0), ({"ignore_eos": True}, 0), ({"min_tokens": 3}, 1),
                                        ({"min_tokens": 3}, 5), ({"top_k": 1, "temperature": 0.7}, 0)])
def test_plain_greedy_pick_equals_the_general_path(kw: dict, outputs: int) -> None:
    core = _Core()
    fast, general = _seq(outputs, **kw), _seq(outputs, **kw)
    general.plain_greedy = False
    assert fast.plain_greedy
    for row in _rows():
        before = row.copy()
        assert core.select(fast, row) == core.select(general, row.copy())
        np.testing.assert_array_equal(row, before)   # the row itself is never edited


@pytest.mark.parametrize("kw", [{"temperature": 0.7}, {"logprobs": 2}, {"repetition_penalty": 1.3},
                                {"presence_penalty": 0.5}, {"logit_bias": {3: 5.0}}])
def test_rows_that_sample_edit_or_report_are_not_plain(kw: dict) -> None:
    assert not _seq(0, **kw).plain_greedy
