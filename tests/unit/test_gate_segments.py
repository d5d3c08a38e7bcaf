"""The layered perplexity gate (models/gate_segments.py, issue 31): a graph cut into runs of
layers gives the logits of the whole graph, each run loading only its own weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper

from ortserve.models import gate_segments
from ortserve.models.quality import LogSoftmaxPick, _log_softmax_pick

D, V, LAYERS = 8, 40, 4


def toy_model(path: Path, shuffled: bool = False) -> None:
    """input_ids -> embedding -> LAYERS x (x + relu(x W_i)) -> logits, weights in a data file;
    ``shuffled`` lists the last layer's nodes first, as ONNX Runtime accepts."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((V, D)).astype(np.float32), "embed"),
             numpy_helper.from_array(rng.standard_normal((D, V)).astype(np.float32), "head")]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h0"], name="/model/embed/Gather")]
    for i in range(LAYERS):
        inits.append(numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32) / 3, f"w{i}"))
        nodes += [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"m{i}"], name=f"/model/layers.{i}/MatMul"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"/model/layers.{i}/Relu"),
                  helper.make_node("Add", [f"h{i}", f"r{i}"], [f"h{i + 1}"], name=f"/model/layers.{i}/Add")]
    nodes.append(helper.make_node("MatMul", [f"h{LAYERS}", "head"], ["logits"], name="/model/lm_head/MatMul"))
    if shuffled:
        nodes = nodes[-4:-1] + nodes[:-4] + nodes[-1:]
    g = helper.make_graph(nodes, "toy", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, None])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, None, V])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=0)


def session(loaded: list[int]):
    def make(p: Path):
        m = onnx.load(str(p), load_external_data=False)
        loaded.append(sum(gate_segments.weight_bytes(t) for t in m.graph.initializer))
        return ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
    return make


@pytest.mark.parametrize("shuffled", [False, True], ids=["sorted", "nodes-out-of-order"])
def test_layered_logits_equal_the_whole_graph_and_each_run_loads_its_own_weights(tmp_path: Path,
                                                                                  shuffled: bool) -> None:
    path = tmp_path / "model.onnx"
    toy_model(path, shuffled)
    windows = [{"input_ids": np.array([[1, 5, 7, 2, 39]], np.int64)}, {"input_ids": np.array([[3, 4]], np.int64)}]
    whole = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = [whole.run(["logits"], w)[0] for w in windows]
    got: dict[int, list[tuple[int, np.ndarray]]] = {0: [], 1: []}
    loaded: list[int] = []
    model = onnx.load(str(path), load_external_data=False)
    layer = D * D * 4
    assert gate_segments.run_layered(path, model, windows, lambda w, c, x: got[w].append((c, x)),
                                     session(loaded), budget=layer)
    for w in (0, 1):
        assert [c for c, _ in got[w]] == [0]
        np.testing.assert_array_equal(got[w][0][1], want[w])
    # the embedding, one layer per run, the last layer with the head: never the whole model
    assert loaded == [V * D * 4, layer, layer, layer, layer + D * V * 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]   # runs removed


def test_a_graph_under_the_budget_is_one_run_and_runs_nothing(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    toy_model(path)
    model = onnx.load(str(path), load_external_data=False)
    assert gate_segments.plan(model, budget=1 << 20) == [(0, len(model.graph.node))]
    assert not gate_segments.run_layered(path, model, [], lambda *_: None, session([]), budget=1 << 20)


def test_out_of_order_nodes_are_sorted_keeping_their_order_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    toy_model(path, shuffled=True)
    model = onnx.load(str(path), load_external_data=False)
    gate_segments.topological(model)
    names = [n.name for n in model.graph.node]
    assert names[0] == "/model/embed/Gather" and names[-1] == "/model/lm_head/MatMul"
    assert names[1:-1] == [f"/model/layers.{i}/{op}" for i in range(LAYERS) for op in ("MatMul", "Relu", "Add")]


def test_log_softmax_in_vocabulary_pieces_equals_the_whole_row() -> None:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((70, 5000)) * 9).astype(np.float32)
    targets = rng.integers(0, 5000, 70)
    want = _log_softmax_pick(logits, targets)
    pick = LogSoftmaxPick(targets)
    for a in (0, 1234, 4096):   # uneven pieces, out of row order within the picker's chunks
        pick.add(a, logits[:, a:{0: 1234, 1234: 4096, 4096: 5000}[a]])
    np.testing.assert_allclose(pick.result(), want, rtol=0, atol=1e-12)
    short = LogSoftmaxPick(targets)
    short.add(0, logits[:, :100])
    with pytest.raises(Exception, match="did not cover every target"):
        short.result()
