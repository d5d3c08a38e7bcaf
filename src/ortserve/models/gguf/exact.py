"""Lossless GGUF import: the file's own quantized blocks on ONNX Runtime's MatMulNBits.

The builder makes the graph (it knows the architectures) at int4 from the dequantized
weights; then every MatMulNBits node gets the GGUF blocks of its weight instead of the
builder's re-quantization (see gguf_reader for the block -> code mapping). Per-block
minimums (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) have no integer zero point, so they become a separate
term computed from block sums of the input:

    y = MatMulNBits(x, codes, scales)  +  (x @ indicator) @ offsets^T

which keeps the integer fast path of the kernel (float zero points run ~50x slower on CPU).
gate_proj and up_proj, which read the same input, become one node with both row sets and
one minimum term, then a Split (docs/bench.md: ~1.1x CPU time per decoded token).

The import refuses (ModelError, with the numbers) unless every patched weight equals the
dequantized reference weight and the logits of a short input match the fp32 reference
build to float rounding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.errors import ModelError
from ortserve.models import convert
from ortserve.models.gguf.families import FAMILY_ARCHITECTURES
from ortserve.models.gguf.reader import (
    FLOAT_TYPES,
    ExactForm,
    GGUFWeights,
    UnsupportedBlockType,
    concat_rows,
    count_types,
    exact_precision,
    pack_codes,
    preflight,
)
from ortserve.models.gguf_check import logit_check, logits, with_accuracy_level

__all__ = ["UnsupportedBlockType", "exact_precision", "import_gguf_exact", "logit_check", "logits", "preflight",
           "with_accuracy_level"]

Progress = Callable[[str], None]

# Builder module -> GGUF tensors (rows concatenated in this order when fused).
MODULES = {
    "attn/qkv_proj": ("attn_q", "attn_k", "attn_v"), "attn/q_proj": ("attn_q",),
    "attn/k_proj": ("attn_k",), "attn/v_proj": ("attn_v",), "attn/o_proj": ("attn_output",),
    "mlp/gate_up_proj": ("ffn_gate", "ffn_up"), "mlp/gate_proj": ("ffn_gate",),
    "mlp/up_proj": ("ffn_up",), "mlp/down_proj": ("ffn_down",),
}
_LAYER_NODE = re.compile(r"^/model/layers\.(\d+)/(\w+/\w+)/MatMul")
# Stores imported at an older version keep working; importer.refresh_stale re-imports them
# (ensure_default does on start; `ortserve models import GGUF` does for any other).
GRAPH_VERSIONS = {1: "one MatMulNBits per linear layer, plus its minimum term",
                  2: "gate_proj + up_proj fused into one MatMulNBits and one minimum term, ~1.08x decode"}
GRAPH_VERSION = max(GRAPH_VERSIONS)
WEIGHT_RTOL = 1e-6        # patched weight vs dequantized reference, relative to max |w|
LOGIT_TOL = 2e-3          # fp32-compute logits vs fp32 reference, relative to max |logit|


def gguf_tensor_names(node_name: str, weights: GGUFWeights) -> tuple[str, ...] | None:
    """The GGUF tensors behind one builder MatMulNBits node (None: not a weight we map)."""
    if node_name.startswith("/lm_head/MatMul"):
        return ("output.weight",) if "output.weight" in weights.tensors else ("token_embd.weight",)
    m = _LAYER_NODE.match(node_name)
    if not m or m.group(2) not in MODULES:
        return None
    return tuple(f"blk.{m.group(1)}.{t}.weight" for t in MODULES[m.group(2)])


def hf_weight_name(gguf_name: str, tied: bool) -> str:
    """GGUF tensor -> Hugging Face Llama-family parameter (as gguf_to_hf saves it)."""
    if gguf_name in ("output.weight", "token_embd.weight"):
        return "model.embed_tokens.weight" if tied or gguf_name == "token_embd.weight" else "lm_head.weight"
    layer, kind = re.match(r"^blk\.(\d+)\.(\w+)\.weight$", gguf_name).groups()  # type: ignore[union-attr]
    module = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj"}[kind]
    return f"model.layers.{layer}.{module}.weight"


class HFWeights:
    """Lazy reader of the dequantized reference weights (safetensors in an HF directory)."""

    def __init__(self, hf_dir: Path) -> None:
        from safetensors import safe_open

        self._files = [safe_open(str(p), framework="np") for p in sorted(Path(hf_dir).glob("*.safetensors"))]
        self.keys = {k: f for f in self._files for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)

    def get(self, name: str) -> np.ndarray:
        if name not in self.keys:
            raise ModelError(f"reference weights lack {name}")
        return self.keys[name].get_tensor(name)


def weight_error(got: np.ndarray, names: tuple[str, ...], ref: HFWeights, tied: bool) -> float:
    """Max |w_exact - w_reference| / max |w_reference| over the rows of one node."""
    want = np.concatenate([ref.get(hf_weight_name(n, tied)).astype(np.float64) for n in names])
    if got.shape != want.shape:
        raise ModelError(f"{'+'.join(names)}: shape {got.shape} vs reference {want.shape}")
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def gate_up_pairs(nodes: list[Any]) -> dict[str, Any]:
    """gate_proj node name -> its layer's up_proj node, where both are bias-free MatMulNBits
    reading the same input (the builder's Llama MLP); those become one fused node."""
    by_name = {n.name: n for n in nodes}
    pairs = {}
    for node in nodes:
        if node.op_type != "MatMulNBits" or "/mlp/gate_proj/" not in node.name:
            continue
        up = by_name.get(node.name.replace("/gate_proj/", "/up_proj/"))
        if (up is not None and up.op_type == "MatMulNBits" and up.input[0] == node.input[0]
                and len(node.input) <= 5 and len(up.input) <= 5):
            pairs[node.name] = up
    return pairs


class GraphPatch:
    """Rewrites the MatMulNBits nodes of one builder graph with exact GGUF weights."""

    def __init__(self, model: Any, weights: GGUFWeights, ref: HFWeights) -> None:
        self.model, self.weights, self.ref = model, weights, ref
        self.tied = "output.weight" not in weights.tensors
        self.inits: list[Any] = []
        self.nodes: list[Any] = []
        self.blocksums: dict[tuple[str, int], str] = {}
        self.report: list[dict[str, Any]] = []
        self.lm_head: tuple[str, ExactForm | str] | None = None   # (old B, form or dense [K, V] name)

    def run(self) -> list[dict[str, Any]]:
        graph = self.model.graph
        pairs = gate_up_pairs(list(graph.node))
        fused_up = {up.name for up in pairs.values()}
        for node in graph.node:
            if node.name in fused_up:
                continue
            if node.name in pairs:
                self.patch_gate_up(node, pairs[node.name])
            elif node.op_type == "MatMulNBits":
                self.patch_matmul(node)
            else:
                self.nodes.append(node)
        if self.lm_head is not None:
            self.patch_tied_embedding()
        del graph.node[:]
        graph.node.extend(self.nodes)
        graph.initializer.extend(self.inits)
        self.drop_unused_initializers()
        return self.report

    def add_init(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def patch_matmul(self, node: Any) -> None:
        from onnx import helper

        names = gguf_tensor_names(node.name, self.weights)
        if names is None:
            raise ModelError(f"no GGUF weight maps to builder node {node.name}")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if any(self.weights.qtype(n) in FLOAT_TYPES for n in names):
            self.patch_dense(node, names, attrs)
            return
        form = concat_rows([self.weights.form(n) for n in names])
        self.check(node, names, attrs, form.dequantize(), bits=form.bits, group=form.group,
                   offsets=form.offsets is not None)
        base = node.input[1].rsplit(".weight", 1)[0]
        if node.name.startswith("/lm_head/"):
            self.lm_head = (node.input[1], form)
        bias = list(node.input[5:6]) if len(node.input) > 5 else []
        inputs = [node.input[0], self.add_init(f"{base}.gguf_codes", pack_codes(form)),
                  self.add_init(f"{base}.gguf_scales", form.scales)]
        del node.input[:]
        node.input.extend(inputs + (["", ""] + bias if bias and bias[0] else []))
        for a in node.attribute:
            if a.name == "bits":
                a.i = form.bits
            elif a.name == "block_size":
                a.i = form.group
        if form.offsets is None:
            self.nodes.append(node)
            return
        # y = MatMulNBits(x) + blocksum(x) @ offsets^T  (the per-block minimum term)
        out = node.output[0]
        node.output[0] = f"{out}/gguf_q"
        xs = self.blocksum(node.input[0], attrs["K"], form.group)
        off = self.add_init(f"{base}.gguf_offsets", np.ascontiguousarray(form.offsets.T))
        self.nodes += [node,
                       helper.make_node("MatMul", [xs, off], [f"{out}/gguf_min"], name=f"{node.name}/gguf_min"),
                       helper.make_node("Add", [f"{out}/gguf_q", f"{out}/gguf_min"], [out],
                                        name=f"{node.name}/gguf_add")]

    def patch_gate_up(self, gate: Any, up: Any) -> None:
        """gate_proj and up_proj read the same input: one MatMulNBits over both row sets (and one
        minimum term), then a Split. Same blocks, same sums per row; two fewer kernels per layer."""
        from onnx import helper

        names = [gguf_tensor_names(node.name, self.weights) or () for node in (gate, up)]
        if any(self.weights.qtype(t) in FLOAT_TYPES for t in names[0] + names[1]):
            self.patch_matmul(gate)     # a float part would make the fused node dense fp32
            self.patch_matmul(up)
            return
        n = [next(a.i for a in node.attribute if a.name == "N") for node in (gate, up)]
        outs = [gate.output[0], up.output[0]]
        gate.name = gate.name.replace("/gate_proj/", "/gate_up_proj/")
        gate.input[1] = gate.input[1].replace(".gate_proj.", ".gate_up_proj.")
        fused = gate.output[0] = outs[0].replace("/gate_proj/", "/gate_up_proj/")
        for a in gate.attribute:
            if a.name == "N":
                a.i = sum(n)
        sizes = self.add_init(f"{gate.input[1].rsplit('.weight', 1)[0]}.gguf_split", np.array(n, np.int64))
        self.patch_matmul(gate)
        self.nodes.append(helper.make_node("Split", [fused, sizes], outs, axis=-1, name=f"{gate.name}/gguf_split"))

    def check(self, node: Any, names: tuple[str, ...], attrs: dict[str, Any], w: np.ndarray,
              **facts: Any) -> None:
        """Refuse unless the node's new weights equal the dequantized reference weights."""
        if w.shape != (attrs["N"], attrs["K"]):
            raise ModelError(f"{node.name}: GGUF shape {w.shape} vs graph N={attrs['N']} K={attrs['K']}")
        err = weight_error(w, names, self.ref, self.tied)
        self.report.append({"node": node.name, "gguf": [self.weights.qtype(n) for n in names],
                            "offsets": False, **facts, "weight_error": err})
        if err > WEIGHT_RTOL:
            raise ModelError(f"exactness check failed: {node.name} differs from the dequantized reference "
                             f"by {err:.3g} (relative, tolerance {WEIGHT_RTOL:g})")

    def patch_dense(self, node: Any, names: tuple[str, ...], attrs: dict[str, Any]) -> None:
        """A node with float matrices in the file: a plain fp32 MatMul (exact, not smaller)."""
        from onnx import helper

        w = np.concatenate([self.weights.dense(n) for n in names]).astype(np.float32)
        self.check(node, names, attrs, w.astype(np.float64), bits=32, group=0)
        base = node.input[1].rsplit(".weight", 1)[0]
        wt = self.add_init(f"{base}.gguf_dense_t", np.ascontiguousarray(w.T))
        if node.name.startswith("/lm_head/"):
            self.lm_head = (node.input[1], wt)
        bias = node.input[5] if len(node.input) > 5 else ""
        out = node.output[0]
        name = node.name.replace("MatMul_Q4", "MatMul")
        if not bias:
            self.nodes.append(helper.make_node("MatMul", [node.input[0], wt], [out], name=name))
            return
        self.nodes += [helper.make_node("MatMul", [node.input[0], wt], [f"{out}/gguf_nobias"], name=name),
                       helper.make_node("Add", [f"{out}/gguf_nobias", bias], [out], name=f"{name}/bias")]

    def blocksum(self, x: str, k: int, group: int) -> str:
        """Sums of x over each group of weights along K, [..., K] -> [..., K/group], as one
        MatMul with a 0/1 indicator (exact: each output adds its group's values, times 1)."""
        from onnx import helper

        if (x, group) not in self.blocksums:
            ind = f"gguf.blocksum_indicator.{k}x{k // group}"
            if not any(t.name == ind for t in self.inits):
                eye = np.zeros((k, k // group), np.float32)
                eye[np.arange(k), np.arange(k) // group] = 1.0
                self.add_init(ind, eye)
            out = f"{x}/gguf_blocksum{group}"
            self.nodes.append(helper.make_node("MatMul", [x, ind], [out], name=f"{out}/MatMul"))
            self.blocksums[(x, group)] = out
        return self.blocksums[(x, group)]

    def patch_tied_embedding(self) -> None:
        """A GatherBlockQuantized embedding reading the LM head's blocks follows the new blocks."""
        from onnx import helper

        old_b, form = self.lm_head  # type: ignore[misc]
        producers = {o: n for n in self.nodes for o in n.output}
        for i, node in enumerate(self.nodes):
            if node.op_type != "GatherBlockQuantized":
                continue
            reshape = producers.get(node.input[0])
            if reshape is None or reshape.op_type != "Reshape" or reshape.input[0] != old_b:
                continue
            base = old_b.rsplit(".weight", 1)[0]
            if isinstance(form, str):       # float head [K, V]: gather rows of its transpose
                table = f"{base}.gguf_dense"
                node.CopyFrom(helper.make_node("Gather", [table, node.input[1]], list(node.output),
                                               name=node.name.replace("GatherBlockQuantized", "Gather")))
                self.nodes.insert(i, helper.make_node("Transpose", [form], [table], perm=[1, 0],
                                                      name=f"{base}/gguf_transpose"))
                self.nodes.remove(reshape)
                break
            v, k = form.codes.shape
            if form.offsets is not None:   # no integer form: the lookup table stays float
                table = self.add_init(f"{base}.gguf_embedding", form.dequantize().astype(np.float32))
                node.CopyFrom(helper.make_node("Gather", [table, node.input[1]], list(node.output),
                                               name=node.name.replace("GatherBlockQuantized", "Gather")))
                self.nodes.remove(reshape)
                break
            reshape.input[0] = f"{base}.gguf_codes"
            reshape.input[1] = self.add_init(f"{base}.gguf_codes/flat_shape",
                                             np.array([v, k * form.bits // 8], np.int64))
            del node.input[2:]
            node.input.append(f"{base}.gguf_scales")
            for a in node.attribute:
                if a.name == "bits":
                    a.i = form.bits
                elif a.name == "block_size":
                    a.i = form.group

    def drop_unused_initializers(self) -> None:
        graph = self.model.graph
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        keep = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(keep)


def patch_model(model_dir: Path, weights: GGUFWeights, hf_dir: Path) -> list[dict[str, Any]]:
    """Swap the builder's re-quantized weights in ``model_dir`` for the GGUF blocks, in place."""
    import onnx

    cfg = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    path = model_dir / cfg.get("filename", "model.onnx")
    model = onnx.load(str(path))
    report = GraphPatch(model, weights, HFWeights(hf_dir)).run()
    data = path.with_name(path.name + ".data")
    for old in (path, data):
        old.unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    return report


def import_gguf_exact(gguf_path: Path, out_dir: Path, work_dir: Path, *, hf_dir: Path | None = None,
                      progress: Progress | None = None) -> dict[str, Any]:
    """Build ``out_dir`` from the GGUF blocks; returns the exactness report.

    Leaves the dequantized HF weights in ``work_dir/hf`` and the fp32 reference build in
    ``work_dir/fp32`` (the caller measures reference perplexity there, then deletes it).
    Raises UnsupportedBlockType before any work if the file has no exact form, and
    ModelError if the result is not exact (``out_dir`` is then unusable: discard it).
    """
    say = progress or (lambda _m: None)
    weights = preflight(Path(gguf_path))
    if weights.arch in FAMILY_ARCHITECTURES:
        raise ModelError(f"{Path(gguf_path).name}: {weights.arch} is imported exactly by the streamed path only "
                         f"(gguf/fast.py import_gguf_streamed); this path patches llama, mistral, qwen2 and qwen3")
    hf = hf_dir or convert.gguf_to_hf(Path(gguf_path), work_dir / "hf", progress)
    convert.build_onnx(hf, out_dir, precision="int4", progress=progress)
    say("replacing re-quantized weights with the GGUF blocks")
    nodes = patch_model(out_dir, weights, hf)
    ref = convert.build_onnx(hf, work_dir / "fp32", precision="fp32", progress=progress)
    check = logit_check(out_dir, ref)
    if check["fp32_compute"] > LOGIT_TOL:
        raise ModelError(f"exactness check failed: logits differ from the fp32 reference by "
                         f"{check['fp32_compute']:.3g} (relative; tolerance {LOGIT_TOL:g})")
    types = count_types(nodes)
    say(f"exact: max weight error {max(n['weight_error'] for n in nodes):.2g}, "
        f"logits {check['fp32_compute']:.2g} (fp32 compute), {check['shipped']:.2g} as shipped")
    return {"method": "gguf-exact", "graph_version": GRAPH_VERSION, "gguf_types": types, "nodes": len(nodes),
            "folded_minimums": sum(n["offsets"] for n in nodes),
            "max_weight_error": max(n["weight_error"] for n in nodes),
            "logit_error": check, "reference_dir": str(ref)}
