"""engine/lora.py's graph edit on packed projections (qkv_proj, gate_up_proj), which the tiny
fp32 test model does not have (the builder's int4 models and the exact GGUF imports do): a
two-projection graph, edited, run by onnxruntime, against numpy's x @ W + s * x @ A @ B per part,
for a mixed batch (a base row, two adapters of different ranks, per-row scales) and for the
one-adapter binding, in both modes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ortserve.engine.lora import Adapter, LoraInputs, Target, add_lora, find_targets

IN, Q, KV, FF = 8, 8, 4, 6  # hidden, q width, k/v width, each of gate/up


def graph(rng: np.random.Generator) -> tuple[Any, list[Target], dict[str, np.ndarray]]:
    from onnx import TensorProto, helper, numpy_helper

    ws = {"qkv_proj": rng.standard_normal((IN, Q + 2 * KV)).astype(np.float32),
          "gate_up_proj": rng.standard_normal((IN, 2 * FF)).astype(np.float32)}
    nodes, outs = [], []
    for kind, name in (("attn", "qkv_proj"), ("mlp", "gate_up_proj")):
        prefix = f"/model/layers.0/{kind}/{name}/MatMul"
        nodes.append(helper.make_node("MatMul", ["x", name], [f"{prefix}/output_0"], name=prefix))
        nodes.append(helper.make_node("Identity", [f"{prefix}/output_0"], [name + "_out"]))
        outs.append(helper.make_tensor_value_info(name + "_out", TensorProto.FLOAT, ["b", "s", None]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", IN])], outs,
                          [numpy_helper.from_array(w, n) for n, w in ws.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    targets = find_targets(model.graph, q_width=Q, kv_width=KV)
    assert sorted(t.kind for t in targets) == ["gate_proj+up_proj", "q_proj+k_proj+v_proj"]
    return model, targets, ws


def adapter(rng: np.random.Generator, name: str, r: int) -> Adapter:
    widths = {"q_proj": Q, "k_proj": KV, "v_proj": KV, "gate_proj": FF, "up_proj": FF}
    return Adapter(name, {f"layers.0.{m}": (rng.standard_normal((IN, r)).astype(np.float32),
                                            rng.standard_normal((r, w)).astype(np.float32))
                          for m, w in widths.items() if not (name == "b" and m == "k_proj")})  # b: no k


@pytest.mark.parametrize("mode", ["mask", "gather"])
def test_packed_projections_take_each_parts_term(mode: str) -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    model, targets, ws = graph(rng)
    adapters = [adapter(rng, "a", 2), adapter(rng, "b", 3)]
    add_lora(model, targets, np.float32, mode)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    lora = LoraInputs(targets, adapters, np.float32, mode)
    for ids, scales in (([0, 1, 2, 2], [1.0, 0.5, 1.0, -2.0]), ([2, 2], [1.0, 0.25])):
        x = rng.standard_normal((len(ids), 3, IN)).astype(np.float32)
        io = session.io_binding()
        io.bind_cpu_input("x", x)
        lora.bound.clear()  # a fresh binding holds no stacks yet (as Runner._binding says)
        held = lora.bind(io, "k", np.array(ids), np.array(scales))  # noqa: F841 - lives until the run
        for name in ("qkv_proj_out", "gate_up_proj_out"):
            io.bind_output(name, "cpu")
        session.run_with_iobinding(io)
        got = dict(zip(("qkv_proj", "gate_up_proj"), (v.numpy() for v in io.get_outputs()), strict=True))
        for packed, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))):
            want = x @ ws[packed]
            for row, (i, s) in enumerate(zip(ids, scales, strict=True)):
                if i == 0:
                    continue
                terms = []
                for m in parts:
                    a, b = adapters[i - 1].weights.get(f"layers.0.{m}", (None, None))
                    width = b.shape[1] if b is not None else KV
                    terms.append(s * (x[row] @ a @ b) if a is not None else np.zeros((3, width), np.float32))
                want[row] += np.concatenate(terms, axis=-1)
            assert np.abs(got[packed] - want).max() <= 1e-4 * np.abs(want).max(), (mode, ids, packed)
