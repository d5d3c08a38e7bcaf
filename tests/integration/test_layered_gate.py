"""The import's perplexity gate a few layers at a time (issue 31), on the real default model:
the same log-probabilities as the whole graph, as shipped and at fp32 compute."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ortserve.models import gate_segments, quality
from ortserve.models.gguf import fast as gguf_fast


@pytest.fixture
def model_copy(default_model: Path, tmp_path: Path) -> Path:
    """A private copy: the gate writes its runs (and the reference its graph) beside the model."""
    out = tmp_path / "m"
    shutil.copytree(default_model, out)
    return out


def test_layered_gate_scores_like_the_whole_graph(model_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(model_copy / "tokenizer.json")).encode(quality.heldout_text()).ids
    runs: list[int] = []
    plan = gate_segments.plan
    monkeypatch.setattr(gate_segments, "plan", lambda m, b: runs.append(len(r := plan(m, b))) or r)
    whole = quality.token_logprobs(model_copy, ids, window=256, budget=0)
    layered = quality.token_logprobs(model_copy, ids, window=256, budget=8 << 20)
    assert runs[-1] >= 10                  # 30 layers in runs of ~8 MB, the LM head in pieces
    assert len(whole) == len(ids) - 1 and np.isfinite(whole).all()
    np.testing.assert_allclose(layered, whole, rtol=0, atol=1e-12)
    assert not [p for p in model_copy.iterdir() if ".gate" in p.name]   # each run removed after it ran


def test_the_fp32_compute_reference_layered_equals_whole(model_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate_segments, "BUDGET", 0)   # token_logprobs: 0 = the whole graph
    whole = gguf_fast.fp32_compute_perplexity(model_copy)
    monkeypatch.setattr(gate_segments, "BUDGET", 8 << 20)
    layered = gguf_fast.fp32_compute_perplexity(model_copy)
    assert whole > 1 and layered == pytest.approx(whole, rel=1e-12)
    assert not [p for p in model_copy.iterdir() if ".gate" in p.name or "fp32-compute" in p.name]


def test_a_directory_the_runs_cannot_be_written_to_scores_the_whole_graph(model_copy: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(model_copy / "tokenizer.json")).encode(quality.heldout_text()).ids[:200]
    whole = quality.token_logprobs(model_copy, ids, budget=0)

    def read_only(*_a: object, **_k: object) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(onnx, "save_model", read_only)   # a --link import of a read-only directory
    assert np.array_equal(quality.token_logprobs(model_copy, ids, budget=8 << 20), whole)
