"""Load-time graph edits to the builder's decoder.

The builder's graph returns logits for every input position: for an 8k-token prompt that is
8k x 49k x 4 B = 1.6 GB, and the LM head over every prompt position is a large share of
prefill compute. The engine samples from the last position of each row, and a speculating row
(engine/speculation/speculate.py) from each position it fed, so ``gather_positions`` picks those before the LM
head: the hidden state is flattened to [batch x positions, hidden], the rows named by an int64
input ``ortserve_logit_rows`` are gathered, and logits come out as [1, rows, vocab] whatever the
input length. The edited graph is handed to ONNX Runtime as bytes; the weights stay in the model
directory's external data file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("ortserve.engine")

_HEADS = {"MatMul", "MatMulNBits", "Gemm", "GgufMatMul"}   # GgufMatMul: models/gguf/native.py
_PASS = {"Cast", "Identity"}  # may sit between the LM head and the output (fp16 models)


def load_decoder(onnx_path: Path) -> Any:
    """The decoder's graph without its weights (they stay in the external data file), or None
    when the onnx package is missing or the file does not parse."""
    try:
        import onnx
    except ImportError:
        log.warning("the onnx package is missing: the decoder runs unedited")
        return None
    try:
        return onnx.load(str(onnx_path), load_external_data=False)
    except Exception:  # noqa: BLE001 - a corrupt file: ONNX Runtime's load reports it as a ModelError
        return None


LOGIT_ROWS = "ortserve_logit_rows"


def gather_positions(model: Any) -> bool:
    """Edit ``model`` in place so its logits cover the flat positions named by the
    ``ortserve_logit_rows`` input (row b, position t of the input is ``b * seq_len + t``), as
    [1, len(rows), vocab]; False (unchanged) when the graph has no recognizable LM head."""
    from onnx import TensorProto, helper

    graph = model.graph
    node = lm_head(graph)
    if node is None:
        return False
    hidden = node.input[0]
    flat, picked, out = (f"{hidden}/ortserve_{x}" for x in ("flat", "picked", "gathered"))
    axes = helper.make_tensor("ortserve/gather/axes", TensorProto.INT64, [1], [0])
    graph.initializer.append(axes)
    graph.input.append(helper.make_tensor_value_info(LOGIT_ROWS, TensorProto.INT64, ["logit_rows"]))
    nodes = [helper.make_node("Flatten", [hidden], [flat], axis=2, name="ortserve/gather/Flatten"),
             helper.make_node("Gather", [flat, LOGIT_ROWS], [picked], axis=0, name="ortserve/gather/Gather"),
             helper.make_node("Unsqueeze", [picked, axes.name], [out], name="ortserve/gather/Unsqueeze")]
    node.input[0] = out
    index = list(graph.node).index(node)
    for i, n in enumerate(nodes):
        graph.node.insert(index + i, n)
    for o in graph.output:
        if o.name == "logits":
            shape = o.type.tensor_type.shape
            shape.dim[0].Clear()
            shape.dim[0].dim_value = 1
            shape.dim[1].Clear()
            shape.dim[1].dim_param = "logit_rows"
    return True


def lm_head(graph: Any) -> Any:
    """The MatMul/MatMulNBits/Gemm/GgufMatMul node that produces ``logits`` (through any Cast/Identity),
    or None when the graph has no recognizable LM head."""
    producer = {out: node for node in graph.node for out in node.output}
    node = producer.get("logits")
    while node is not None and node.op_type in _PASS:
        node = producer.get(node.input[0])
    return node if node is not None and node.op_type in _HEADS else None
