"""Batched LoRA: one session, one KV budget, a different adapter on every row (S-LoRA/Punica style).

At load, ``add_lora`` edits the builder's decoder: after every projection MatMul/MatMulNBits
of every layer (``attn/qkv_proj`` or ``q_proj``/``k_proj``/``v_proj``, ``o_proj``,
``mlp/gate_proj``, ``up_proj``, ``down_proj``, found by the builder's node names) it adds

    y += (x @ Gather(A_stack, lora_ids)) @ Gather(B_stack, lora_ids)

where ``lora_ids`` is a new input, one adapter index per row (0 is the zero adapter: the base
model), ``A_stack`` is ``[adapters, in, rank]`` and ``B_stack`` ``[adapters, rank, out]`` with
the adapter's scale folded into B. A batch mixing the base and several adapters is one call.

Why the stacks are graph inputs, not initializers: adding or dropping an adapter then costs a
numpy concatenation (milliseconds), not a new session (seconds, and a second prepacked copy
of the weights while both live). Their dims are symbolic, so the rank of the stack is the
largest rank loaded and grows or shrinks with the set. A packed projection (the builder packs
q, k and v into ``qkv_proj``) takes one term with A = [A_q A_k A_v] and B block-diagonal,
which is exactly the concatenation of the three separate terms.

Adapters themselves are numpy, per HF module (``layers.3.q_proj``): A ``[in, r]`` and
B ``[r, out]`` (scale folded). models/adapters.py reads PEFT directories into that form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

IDS = "lora_ids"
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_NODE = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)/(MatMul|MatMulNBits)$")


@dataclass(frozen=True)
class Target:
    """One projection node of the decoder that takes a LoRA term."""

    layer: int
    node: str                          # the builder's node name
    parts: tuple[tuple[str, int], ...]  # (HF module, output width) in output order
    inputs: int                        # in features

    @property
    def key(self) -> str:
        return f"layers.{self.layer}.{'+'.join(p for p, _ in self.parts)}"

    @property
    def outputs(self) -> int:
        return sum(w for _, w in self.parts)


@dataclass
class Adapter:
    """A LoRA adapter as numpy: ``weights[f"layers.{i}.{module}"] = (A [in, r], B [r, out])``."""

    name: str
    weights: dict[str, tuple[np.ndarray, np.ndarray]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return max((a.shape[1] for a, _ in self.weights.values()), default=0)


def _weight_dims(graph: Any, node: Any) -> tuple[int, int] | None:
    """(in, out) of a projection node: MatMul's weight initializer is [in, out]; MatMulNBits says K, N."""
    if node.op_type == "MatMulNBits":
        attrs = {a.name: a.i for a in node.attribute}
        return (attrs["K"], attrs["N"]) if "K" in attrs and "N" in attrs else None
    inits = {t.name: t for t in graph.initializer}
    w = inits.get(node.input[1])
    return (int(w.dims[0]), int(w.dims[1])) if w is not None and len(w.dims) == 2 else None


def find_targets(graph: Any, *, q_width: int, kv_width: int) -> list[Target]:
    """Every decoder projection that can take a LoRA term, with its shapes (from the graph)."""
    out = []
    for node in graph.node:
        m = _NODE.match(node.name)
        if m is None or (m.group(3) not in MODULES and m.group(3) not in PACKED):
            continue
        dims = _weight_dims(graph, node)
        if dims is None:
            continue
        name = m.group(3)
        if name == "qkv_proj":
            parts = (("q_proj", q_width), ("k_proj", kv_width), ("v_proj", kv_width))
        elif name == "gate_up_proj":
            parts = (("gate_proj", dims[1] // 2), ("up_proj", dims[1] // 2))
        else:
            parts = ((name, dims[1]),)
        if sum(w for _, w in parts) != dims[1]:
            continue  # a packing this code does not know: leave the node alone
        out.append(Target(layer=int(m.group(1)), node=node.name, parts=parts, inputs=dims[0]))
    return out


def add_lora(model: Any, targets: list[Target], dtype: Any) -> None:
    """Edit ``model`` (an onnx ModelProto) in place: the LoRA term after every target, and the
    ``lora_ids`` input plus two stack inputs per target."""
    from onnx import TensorProto, helper

    elem = TensorProto.FLOAT16 if np.dtype(dtype) == np.float16 else TensorProto.FLOAT
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info(IDS, TensorProto.INT64, ["batch_size"]))
    by_name = {t.node: t for t in targets}
    nodes = list(graph.node)
    new_nodes = []
    for node in nodes:
        new_nodes.append(node)
        t = by_name.get(node.name)
        if t is None:
            continue
        a_in, b_in = f"lora.{t.key}.A", f"lora.{t.key}.B"
        rank = f"lora_rank/{t.key}"  # its own name: a packed qkv stack is wider than o_proj's
        graph.input.append(helper.make_tensor_value_info(a_in, elem, ["lora_adapters", t.inputs, rank]))
        graph.input.append(helper.make_tensor_value_info(b_in, elem, ["lora_adapters", rank, t.outputs]))
        y = node.output[0]
        p = f"/ortserve/lora/{t.key}"
        summed = f"{y}/lora"
        for other in nodes:  # everything that read y reads y + the LoRA term
            for i, name in enumerate(other.input):
                if name == y:
                    other.input[i] = summed
        new_nodes += [
            helper.make_node("Gather", [a_in, IDS], [f"{p}/A"], name=f"{p}/GatherA", axis=0),
            helper.make_node("MatMul", [node.input[0], f"{p}/A"], [f"{p}/xA"], name=f"{p}/MatMulA"),
            helper.make_node("Gather", [b_in, IDS], [f"{p}/B"], name=f"{p}/GatherB", axis=0),
            helper.make_node("MatMul", [f"{p}/xA", f"{p}/B"], [f"{p}/xAB"], name=f"{p}/MatMulB"),
            helper.make_node("Add", [y, f"{p}/xAB"], [summed], name=f"{p}/Add"),
        ]
    del graph.node[:]
    graph.node.extend(new_nodes)


def stacks(targets: list[Target], adapters: list[Adapter], dtype: Any) -> dict[str, np.ndarray]:
    """The stack inputs for ``adapters`` (index i+1 is adapters[i]; index 0 is all zeros)."""
    out = {}
    n = len(adapters) + 1
    for t in targets:
        ranks = [[a.weights[f"layers.{t.layer}.{m}"][0].shape[1] if f"layers.{t.layer}.{m}" in a.weights else 0
                  for m, _ in t.parts] for a in adapters]
        rank = max([sum(r) for r in ranks] + [1])
        a_stack = np.zeros((n, t.inputs, rank), dtype=dtype)
        b_stack = np.zeros((n, rank, t.outputs), dtype=dtype)
        for i, adapter in enumerate(adapters, start=1):
            col = row = 0
            for m, width in t.parts:
                w = adapter.weights.get(f"layers.{t.layer}.{m}")
                if w is not None:
                    a, b = w
                    r = a.shape[1]
                    a_stack[i, :, col:col + r] = a
                    b_stack[i, col:col + r, row:row + width] = b
                    col += r
                row += width
        out[f"lora.{t.key}.A"] = a_stack
        out[f"lora.{t.key}.B"] = b_stack
    return out


class AdapterView:
    """An engine as the requests for one adapter see it: ``submit``/``generate`` run on the base
    engine with ``adapter`` set on the sequence; everything else is the base engine's."""

    def __init__(self, engine: Any, adapter: str, model_id: str) -> None:
        self.engine = engine
        self.adapter = adapter
        self.model_id = model_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def submit(self, **kw: Any) -> Any:
        return self.engine.submit(adapter=self.adapter, **kw)

    async def generate(self, **kw: Any) -> Any:
        return await self.engine.generate(adapter=self.adapter, **kw)
