"""Load-time graph edits to the builder's decoder.

``fuse_swiglu`` hands the MLP's SwiGLU to the GGUF-native down projection (one node a layer instead
of four), and ``skip_rms_norm`` swaps SkipSimplifiedLayerNormalization for the library's
SkipRmsNorm, the same computation without onnxruntime's per-call set-up (docs/native.md).

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


def native_edits(model: Any, library: Path | None) -> dict[str, int]:
    """The two edits below on ``model``, for the kernels of ``library`` (None: none); how many
    nodes each changed: ``swiglu`` (layers folded) and ``norm`` (nodes swapped). The library is
    asked once what it offers."""
    if library is None:
        return {}
    from ortserve.native import library_features

    features = library_features(library)
    return {"swiglu": fuse_swiglu(model, features), "norm": skip_rms_norm(model, features)}


def fuse_swiglu(model: Any, features: frozenset[str]) -> int:
    """Edit ``model`` in place: each ``Split(gate_up) -> Sigmoid, Mul (silu) -> Mul (by up) ->
    GgufMatMul (down)`` becomes the one GgufMatMul with ``swiglu=1`` reading the fused gate_up
    projection; returns how many. Only when ``features`` (``native.library_features`` of the
    library the session loads) has the attribute, and only where every tensor between the two
    projections is read by the pattern alone: a LoRA term on down_proj (engine/lora.py, applied
    first) reads the product, so that layer keeps its nodes."""
    from onnx import helper

    from ortserve.native import DOMAIN, MATMUL_OP

    graph = model.graph
    downs = [n for n in graph.node if n.op_type == MATMUL_OP and n.domain == DOMAIN
             and not any(a.name == "swiglu" for a in n.attribute)]
    if not downs or "swiglu" not in features:
        return 0
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    inits = {t.name: t for t in graph.initializer}
    gone: set[int] = set()
    sizes: set[str] = set()
    for down in downs:
        found = _swiglu_nodes(down, producer, readers, outputs, inits)
        if found is None:
            continue
        split = found[0]
        down.input[0] = split.input[0]
        down.attribute.append(helper.make_attribute("swiglu", 1))
        gone.update(id(n) for n in found)
        sizes.add(split.input[1])
    if gone:
        kept = [n for n in graph.node if id(n) not in gone]
        del graph.node[:]
        graph.node.extend(kept)
        read = {name for n in kept for name in n.input}
        for t in [t for t in graph.initializer if t.name in sizes - read]:   # the Splits' sizes, unless shared
            graph.initializer.remove(t)
    return len(gone) // 4


def _swiglu_nodes(down: Any, producer: dict[str, Any], readers: dict[str, list[Any]], outputs: set[str],
                  inits: dict[str, Any]) -> list[Any] | None:
    """[Split, Sigmoid, silu Mul, product Mul] when ``down`` reads silu(gate) * up of one even
    Split of a [..., 2K] projection along its last axis, each tensor read by the pattern alone."""
    from onnx import numpy_helper

    def only(name: str, *nodes: Any) -> bool:
        return name not in outputs and {id(n) for n in readers.get(name, [])} == {id(n) for n in nodes}

    k = next((a.i for a in down.attribute if a.name == "K"), 0)
    mul = producer.get(down.input[0])
    if mul is None or mul.op_type != "Mul" or not only(mul.output[0], down):
        return None
    for act_in, up in (mul.input, reversed(mul.input)):
        silu = producer.get(act_in)
        if silu is None or silu.op_type != "Mul" or not only(silu.output[0], mul):
            continue
        for gate, sig_out in (silu.input, reversed(silu.input)):
            sig = producer.get(sig_out)
            split = producer.get(gate)
            if sig is None or sig.op_type != "Sigmoid" or sig.input[0] != gate or not only(sig_out, silu):
                continue
            if split is None or split.op_type != "Split" or list(split.output) != [gate, up]:
                continue
            axis = next((a.i for a in split.attribute if a.name == "axis"), 0)
            sizes = inits.get(split.input[1]) if len(split.input) > 1 else None
            even = sizes is not None and numpy_helper.to_array(sizes).tolist() == [k, k]
            if axis == -1 and even and only(gate, sig, silu) and only(up, mul):
                return [split, sig, silu, mul]
    return None


def skip_rms_norm(model: Any, features: frozenset[str]) -> int:
    """Edit ``model`` in place: each SkipSimplifiedLayerNormalization of a float32 graph (caches in
    float32), without a bias and with no attribute but epsilon, becomes the library's SkipRmsNorm
    with the two outputs ortserve's graphs read (the normed rows, the residual sum); returns how
    many. Only when ``features`` (``native.library_features``) has the op."""

    from ortserve.native import DOMAIN, ensure_domain

    graph = model.graph
    nodes = [n for n in graph.node if n.op_type == "SkipSimplifiedLayerNormalization" and n.domain == "com.microsoft"]
    if not nodes or not _float_caches(graph) or "skip_rms_norm" not in features:
        return 0
    swapped = 0
    for node in nodes:
        outs = list(node.output)
        if len(node.input) != 3 or [a.name for a in node.attribute] != ["epsilon"] or any(outs[1:3]):
            continue
        total = outs[3] if len(outs) > 3 and outs[3] else f"{node.name}/ortserve_sum"
        node.op_type, node.domain = "SkipRmsNorm", DOMAIN
        del node.output[:]
        node.output.extend([outs[0], total])
        swapped += 1
    if swapped:
        ensure_domain(model)
    return swapped


def _float_caches(graph: Any) -> bool:
    """Whether the graph holds its KV cache in float32 (the ops' only type)."""
    from onnx import TensorProto

    return any(v.name.startswith("past_key_values.") and v.type.tensor_type.elem_type == TensorProto.FLOAT
               for v in graph.input)

