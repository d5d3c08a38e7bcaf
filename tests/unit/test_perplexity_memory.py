"""The perplexity gate's log-softmax works a few rows at a time (issue 31): a 512-token window
of a 128k vocabulary made three 0.5 GB float64 temporaries at once, most of the whole
import's peak RSS on a 1B model (docs/scale.md, "The memory of the whole import")."""

from __future__ import annotations

import tracemalloc

import numpy as np

from ortserve.models.quality import _log_softmax_pick


def whole(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x[np.arange(len(targets)), targets] - (m[:, 0] + np.log(np.exp(x - m).sum(-1)))


def test_chunked_log_softmax_equals_the_whole_window_and_holds_a_few_rows() -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((301, 40000), dtype=np.float32) * 8).astype(np.float32)  # 301: a partial last chunk
    targets = rng.integers(0, 40000, 301)
    want = whole(logits, targets)
    tracemalloc.start()
    got = _log_softmax_pick(logits, targets)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert np.array_equal(got, want)      # row by row: the same float64 arithmetic, bit for bit
    one_copy = logits.size * 8            # one float64 copy of the window: 96 MB here
    assert peak < one_copy / 2, f"peak {peak / 1e6:.1f} MB of temporaries for a {one_copy / 1e6:.0f} MB window"
