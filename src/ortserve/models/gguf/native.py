"""The streamed GGUF graph on the project's own GGUF-native kernels (ortserve.native).

Where the native library is active, every matrix whose block type it reads becomes one
``ortserve.gguf::GgufMatMul`` on the file's own rows (uint8 [N, row_bytes], the bytes of the
file; llama.cpp's Q/K row permutation moves whole rows, never a block), and a quantized token
embedding one ``GgufGather``. A tied LM head and the embedding read the same initializer. No
minimum term, no widening: a decoded token reads the file's weight bytes once.

Matrices the library does not read (F16/F32, Q2_K, Q3_K, IQ4_*) keep today's form (plain MatMul
or MatMulNBits) in the same graph; q/k/v and gate/up are fused only when they share one block
type (concatenated rows of one type are valid rows of that type).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.models.gguf.reader import BLOCK_SIZES, GGUFWeights
from ortserve.models.gguf.stream import DataFile, release_pages, tensor_rows
from ortserve.native import DOMAIN, GATHER_OP, MATMUL_OP, TYPE_IDS

OPS = (MATMUL_OP, GATHER_OP)
GGML_IDS = TYPE_IDS  # ggml's type ids of the block types the ops read (the ops' contract)
CHUNK_BYTES = 16 << 20   # raw rows copied at once


@dataclass
class Plan:
    """Whether this import writes the native graph, and why (not)."""

    use: bool
    reason: str
    library: Path | None = None
    isa: str | None = None
    types: tuple[int, ...] = tuple(GGML_IDS.values())


def plan() -> Plan:
    """The native graph when ortserve.native says its ops are usable here (built, loaded, a CPU
    with a fast path, not switched off by ORTSERVE_NATIVE=0); else why not."""
    try:
        from ortserve import native
    except ImportError as exc:   # a build without the package: today's graph
        return Plan(False, f"ortserve.native is not available ({exc})")
    try:
        st = native.status()
    except Exception as exc:  # noqa: BLE001 - any failure to load means: today's graph
        return Plan(False, f"the native library did not load ({exc})")
    if not st.active or st.library is None:
        return Plan(False, st.reason)
    return Plan(True, st.reason, Path(st.library), st.isa, tuple(sorted(native.SUPPORTED_TYPES)))


@dataclass
class RawNode:
    """One raw-rows initializer: what a GgufMatMul (or a tied GgufGather) reads."""

    init: str
    ggml_type: int
    n: int
    k: int


class NativeOps:
    """Writes the native nodes for a ``gguf_graph.GraphWriter`` (its ``native`` hook)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.nodes = 0

    def covers(self, w: GGUFWeights, names: tuple[str, ...]) -> bool:
        return all(GGML_IDS.get(w.qtype(n)) in self.plan.types for n in names)

    def fusable(self, w: GGUFWeights, names: tuple[str, ...]) -> bool:
        return self.covers(w, names) and len({w.qtype(n) for n in names}) == 1

    def raw(self, data: DataFile, w: GGUFWeights, names: tuple[str, ...], base: str) -> tuple[RawNode, Any]:
        """Stream the file's rows of ``names`` (concatenated, one block type) into ``data``."""
        qtype = w.qtype(names[0])
        per, size = BLOCK_SIZES[qtype]
        shapes = [tensor_rows(w, n) for n in names]
        k = shapes[0][1]
        row_bytes = k // per * size

        def chunks() -> Iterator[np.ndarray]:
            for name, (rows, _) in zip(names, shapes):
                raw = np.asarray(w.tensors[name].data, np.uint8).reshape(rows, row_bytes)
                perm = w.row_permutation(name, rows)
                step = max(1, CHUNK_BYTES // row_bytes)
                for a in range(0, rows, step):
                    yield raw[a:a + step] if perm is None else raw[perm[a:a + step]]
                    release_pages(w)

        n = sum(r for r, _ in shapes)
        t = data.tensor(f"{base}.gguf_rows", [n, row_bytes], np.uint8, chunks())
        self.nodes += 1
        return RawNode(t.name, GGML_IDS[qtype], n, k), t

    def linear(self, g: Any, x: str, names: tuple[str, ...], name: str) -> tuple[str, RawNode]:
        """y = x @ dequant(rows)^T as one GgufMatMul; its output keeps the builder's name."""
        base = name.strip("/").replace("/", ".")
        node, t = self.raw(g.data, g.w, names, base)
        g.inits.append(t)
        g.node("GgufMatMul", [x, node.init], f"{name}/MatMul_Gguf", ggml_type=node.ggml_type, K=node.k, N=node.n)
        g.report.append({"node": name, "gguf": [g.w.qtype(n) for n in names], "bits": 0, "group": 0,
                         "offsets": False, "kernel": "gguf-native"})
        g.nodes[-1].output[0] = f"{name}/MatMul/output_0"   # engine/lora.py finds projections by it
        return g.nodes[-1].output[0], node

    def embedding(self, g: Any, head: Any) -> str | None:
        """GgufGather over the LM head's rows when tied, else over token_embd's; None: not native."""
        name = "token_embd.weight"
        if g.spec.tied and isinstance(head, RawNode):
            node = head
        elif g.spec.tied or not self.covers(g.w, (name,)):
            return None
        else:
            node, t = self.raw(g.data, g.w, (name,), "model.embed_tokens")
            g.inits.append(t)
        return g.node("GgufGather", [node.init, "input_ids"], "/model/embed_tokens/GgufGather",
                      ggml_type=node.ggml_type, K=node.k, V=node.n)[0]


def uses_native(model: Any) -> bool:
    return any(n.domain == DOMAIN for n in model.graph.node)


def install_library(plan: Plan, out_dir: Path) -> str:
    """Copy the library into the model folder (onnxruntime-genai loads it from there only);
    returns its file name, which genai_config.json names."""
    from ortserve import native

    assert plan.library is not None
    copy = native.install_into(out_dir, plan.library)
    assert copy is not None
    return copy.name


def weight_bytes_per_token(model: Any) -> int:
    """Bytes of weight initializers a decoded token reads: every matrix a node multiplies by
    (MatMul, MatMulNBits with its scales/offsets, GgufMatMul), plus one row of each embedding
    table. Norms and rotary caches are left out (a few KB per layer)."""
    sizes = {t.name: _nbytes(t) for t in model.graph.initializer}
    rows = {t.name: int(t.dims[0]) for t in model.graph.initializer if t.dims}
    total = 0
    for n in model.graph.node:
        if n.op_type in ("MatMulNBits", "GgufMatMul") or (n.op_type == "MatMul" and n.input[1] in sizes):
            total += sum(sizes.get(i, 0) for i in n.input[1:])
        elif n.op_type in ("GgufGather", "GatherBlockQuantized", "Gather") and n.input[0] in sizes:
            total += sizes[n.input[0]] // max(rows[n.input[0]], 1)
    return total


def _nbytes(t: Any) -> int:
    ext = {e.key: e.value for e in t.external_data}
    if "length" in ext:
        return int(ext["length"])
    return len(t.raw_data) if t.raw_data else int(np.prod(t.dims, dtype=np.int64)) * 4
