"""Issue 45 part 4: the same text gets the same vector whatever else is in the request, for
every embedding variant in the store (fp32-cpu and int8-cpu of the default MiniLM)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ortserve.engine.embed import Embedder

SHORT = "a cat sat"
LONGER = ["A much longer sentence about the weather in the mountains today, tomorrow and the day after.",
          "Another long text that goes on and on about nothing in particular, at considerable length."]


def _variant_dir(embedding_model: Path, precision: str) -> Path:
    """The sibling variant of the default embedding model with this precision."""
    d = embedding_model.parent / embedding_model.name.replace("--int8-", f"--{precision}-").replace(
        "--fp32-", f"--{precision}-")
    assert (d / "model.onnx").is_file(), f"no {precision} variant beside {embedding_model}"
    return d


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_text_gets_the_same_vector_alone_and_beside_longer_texts(embedding_model: Path,
                                                                    precision: str) -> None:
    emb = Embedder(_variant_dir(embedding_model, precision))
    assert emb.per_row is (precision == "int8")     # dynamic quantization -> one input per run
    alone = emb.embed_texts([SHORT]).vectors[0]
    beside = emb.embed_texts([SHORT, *LONGER]).vectors
    assert np.array_equal(beside[0], alone)
    # in the middle of a batch, and beside a text of exactly its own length
    mixed = emb.embed_texts([LONGER[1], SHORT, "a dog ran", LONGER[0]]).vectors
    assert np.array_equal(mixed[1], alone)
    assert np.array_equal(mixed[0], beside[2]) and np.array_equal(mixed[3], beside[1])
    # token arrays take the same path
    ids = emb.tokenize([SHORT])[0]
    assert np.array_equal(emb.embed_ids([ids, *emb.tokenize(LONGER)]).vectors[0], alone)
