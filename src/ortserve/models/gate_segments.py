"""The perplexity gate of a large model, a few layers at a time (issue 31).

A session holds a model's weights as ONNX Runtime packs them: 1.67x a Q4_K_M file. The gate used
to load the whole graph, so importing a model needed the memory of serving it (3.4x the file in
all). Here the graph is cut into contiguous runs of nodes, each with about ``budget`` bytes of
weights, written beside the model so they share its weights file. Each run loads, scores every
window, and is dropped before the next loads; only the values that cross a cut (a hidden state
per window, a few KB of mask bookkeeping) are kept between them. A topologically sorted node list
cut into contiguous runs needs nothing else, and the cuts fall where a layer begins, so every
fusion ONNX Runtime makes inside a layer is the one it makes in the whole graph.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

BUDGET = 256 << 20     # weights per run: a few layers of a 1-8B model
_LAYER = re.compile(r"/layers\.(\d+)/|/rows(\d+)$")   # a layer, or a piece of the LM head
ROWS = 16384           # LM-head rows per piece
_PIECE = re.compile(r"/rows(\d+)$")


def weight_bytes(t: Any) -> int:
    """An initializer's size on disk or in the proto (typed fields: about 4 bytes a value)."""
    ext = {e.key: e.value for e in t.external_data}
    if "length" in ext:
        return int(ext["length"])
    return len(t.raw_data) or int(np.prod(t.dims, dtype=np.int64)) * 4


def topological(model: Any) -> None:
    """Sort the graph's nodes so each comes after what it reads, otherwise keeping their order
    (ONNX Runtime sorts a graph itself, so a graph may list, say, its mask nodes last)."""
    import heapq

    nodes = list(model.graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waits = [{producer[x] for x in n.input if x in producer} for n in nodes]
    users: dict[int, list[int]] = {}
    for i, w in enumerate(waits):
        for j in w:
            users.setdefault(j, []).append(i)
    ready = [i for i, w in enumerate(waits) if not w]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, []):
            waits[u].discard(i)
            if not waits[u]:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise ValueError("the graph has a cycle")
    del model.graph.node[:]
    model.graph.node.extend(nodes[i] for i in order)


def plan(model: Any, budget: int = BUDGET) -> list[tuple[int, int]]:
    """Contiguous [start, end) node ranges of a topologically sorted graph, of about ``budget``
    weight bytes, cut where a layer (or an LM-head piece) begins; one range (the whole graph)
    when it is small or has no numbered layers."""
    nodes = model.graph.node
    if any(a.type in (5, 10) for n in nodes for a in n.attribute):   # GRAPH(S): If/Loop bodies see outer values
        return [(0, len(nodes))]
    sizes = {t.name: weight_bytes(t) for t in model.graph.initializer}
    cuts, seen, held, layer = [0], set(), 0, None
    for i, n in enumerate(nodes):
        m = _LAYER.search(n.name)
        if m and m.group(0) != layer:
            layer = m.group(0)
            if held >= budget:   # a new run counts what it loads, shared tensors again
                cuts.append(i)
                seen, held = set(), 0
        for name in n.input:
            if name in sizes and name not in seen:
                seen.add(name)
                held += sizes[name]
    cuts.append(len(nodes))
    return list(pairwise(cuts))


def _segments(model: Any, ranges: list[tuple[int, int]],
              keep: set[str]) -> Iterator[tuple[Any, list[str], set[str]]]:
    """Each range as a model: its nodes, the initializers they read, inputs from earlier runs (or
    the graph), and as outputs what later runs read and the graph outputs in ``keep``; with its
    inputs' names and the names later runs read (or ``keep``)."""
    from onnx import helper

    nodes = model.graph.node
    inits = {t.name: t for t in model.graph.initializer}
    graph_inputs = {i.name: i for i in model.graph.input}
    consumed_after: list[set[str]] = []
    later: set[str] = set(keep)
    for a, b in reversed(ranges):
        consumed_after.append(set(later))
        for n in nodes[a:b]:
            later.update(x for x in n.input if x)
    consumed_after.reverse()
    for (a, b), after in zip(ranges, consumed_after):
        part = nodes[a:b]
        made = {o for n in part for o in n.output if o}
        read = [x for n in part for x in n.input if x and x not in made]
        inputs = list(dict.fromkeys(x for x in read if x not in inits))
        outs = sorted(o for o in made if o in after)
        g = helper.make_graph(
            list(part), f"gate{a}",
            [graph_inputs[x] if x in graph_inputs else helper.make_empty_tensor_value_info(x) for x in inputs],
            [helper.make_empty_tensor_value_info(o) for o in outs],
            [inits[x] for x in dict.fromkeys(read) if x in inits])
        m = helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version)
        yield m, inputs, after


def _typed(m: Any, feeds: dict[str, np.ndarray]) -> None:
    """Declare the element type of inputs that came from an earlier run, from their values."""
    from onnx import helper

    for i in m.graph.input:
        if not i.type.HasField("tensor_type") and i.name in feeds:
            i.CopyFrom(helper.make_tensor_value_info(i.name, helper.np_dtype_to_tensor_dtype(feeds[i.name].dtype), None))


def logit_pieces(model: Any, rows: int = ROWS) -> list[str] | None:
    """Split a wide LM head into pieces of ``rows`` outputs (``gguf_check.split_wide``: the same
    sums) and drop the Concat that joins them, so a run holds one piece's weights and logits; the
    pieces' names in vocabulary order, or None where the logits are not such a Concat."""
    from ortserve.models.gguf_check import split_wide

    split_wide(model, rows)
    nodes = model.graph.node
    last = next((i for i, n in enumerate(nodes) if "logits" in n.output), None)
    if last is None or nodes[last].op_type != "Concat":
        return None
    pieces = list(nodes[last].input)
    if not all(_PIECE.search(p) for p in pieces):   # not split_wide's pieces: keep the whole logits
        return None
    del nodes[last]
    return pieces


def first_row(piece: str) -> int:
    """The vocabulary column where a piece's logits start (split_wide names it by its first row)."""
    m = _PIECE.search(piece)
    return int(m.group(1)) if m else 0


def run_layered(onnx_path: Path, model: Any, windows: list[dict[str, np.ndarray]],
                on_logits: Callable[[int, int, np.ndarray], None], session: Callable[[Path], Any],
                budget: int = BUDGET, after_each: Callable[[], None] = lambda: None) -> bool:
    """Run ``model`` (the graph at ``onnx_path``, loaded without its weights) over ``windows``
    (feeds) a run of layers at a time, handing each window's logits to ``on_logits(window,
    first column, logits)``, in pieces of the vocabulary where the LM head is wide; ``after_each``
    runs once a run's session is dropped. False, having run nothing, where the graph is one run."""
    import onnx

    topological(model)
    ranges = plan(model, budget)
    if len(ranges) < 2:
        return False
    pieces = logit_pieces(model) or ["logits"]
    ranges = plan(model, budget)
    values = [dict(w) for w in windows]
    for k, (m, inputs, later) in enumerate(_segments(model, ranges, set(pieces))):
        _typed(m, values[0])
        path = onnx_path.with_name(f"{onnx_path.stem}.gate{k}.onnx")
        onnx.save_model(m, str(path))
        try:
            sess = session(path)
            names = [o.name for o in sess.get_outputs()]
            for w, vals in enumerate(values):
                got = dict(zip(names, sess.run(names, {x: vals[x] for x in inputs})))
                for name in pieces:
                    if name in got:
                        on_logits(w, first_row(name), got.pop(name))
                values[w] = {**{x: v for x, v in vals.items() if x in later}, **got}
            del sess
        finally:
            path.unlink(missing_ok=True)
        after_each()
    return True
