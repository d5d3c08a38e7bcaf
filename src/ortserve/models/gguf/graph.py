"""The ONNX Runtime GenAI graph of a Llama-family GGUF, written from the file's metadata alone.

No transformers model, no builder, no fp32 copy of the weights: the graph is the builder's
Llama graph (GroupQueryAttention with rotary, SkipSimplifiedLayerNormalization, the same
input/output names), and every matrix is the GGUF's own blocks on MatMulNBits, streamed
into the external data by ``gguf_stream`` (the block -> code mapping is gguf_reader's).

Unlike the patched builder graph, q/k/v are fused only when their blocks share one layout
(a Q4_K_M file keeps Q4_K q/k at 4 bits beside a Q6_K v at 8), so no matrix is widened.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortserve.errors import ModelError
from ortserve.models.gguf.reader import GGUFWeights, _field
from ortserve.models.gguf.rope import rope_divisors
from ortserve.models.gguf.stream import (
    Checks,
    DataFile,
    common_layout,
    dense_rows,
    is_float,
    vector,
    write_node,
)
from ortserve.native import DOMAIN as NATIVE_DOMAIN
from ortserve.native import GATHER_OP, MATMUL_OP
from ortserve.native import OPSET as NATIVE_OPSET

# GGUF architectures this graph writer covers: the Llama graph, plus q/k/v biases (qwen2)
# and per-head q/k RMS norms (qwen3) where the file has those tensors; phi3 and gemma2/3 add
# their parts through the hooks below (gguf_families.FamilyWriter).
STREAM_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")
ACCURACY_LEVEL = 4      # int8 activations: MatMulNBits' fast CPU path (see docs/gguf.md)


@dataclass
class Spec:
    """The shape of the model, from the GGUF's metadata."""

    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    context: int
    eps: float
    theta: float
    rope_dim: int
    tied: bool

    @classmethod
    def of(cls, weights: GGUFWeights, reader: Any) -> Spec:
        a = weights.arch
        if a not in STREAM_ARCHITECTURES:
            raise ModelError(f"streaming import covers {', '.join(STREAM_ARCHITECTURES)}, not {a}")
        hidden = int(_field(reader, f"{a}.embedding_length"))
        heads = int(_field(reader, f"{a}.attention.head_count"))
        head_dim = int(_field(reader, f"{a}.attention.key_length", hidden // heads))
        vocab = int(weights.tensors["token_embd.weight"].shape[1])
        return cls(a, int(_field(reader, f"{a}.block_count")), hidden, heads,
                   int(_field(reader, f"{a}.attention.head_count_kv", heads)), head_dim,
                   int(_field(reader, f"{a}.feed_forward_length")), vocab,
                   int(_field(reader, f"{a}.context_length", 4096)),
                   float(_field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
                   float(_field(reader, f"{a}.rope.freq_base", 10000.0)),
                   int(_field(reader, f"{a}.rope.dimension_count", head_dim)),
                   "output.weight" not in weights.tensors)


def rotary_caches(spec: Spec, factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [context, rope_dim/2] as the builder makes them; ``factors`` (GGUF
    rope_freqs, Llama 3's frequency scaling) divide the frequencies as llama.cpp does."""
    inv = 1.0 / spec.theta ** (np.arange(0, spec.rope_dim, 2, dtype=np.int64).astype(np.float32) / spec.rope_dim)
    if factors is not None:
        inv = inv / factors.astype(np.float32)
    freqs = np.outer(np.arange(spec.context, dtype=np.float32), inv.astype(np.float32))
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


class GraphWriter:
    """Nodes in order, initializers streamed to ``data`` as each node is written."""

    def __init__(self, weights: GGUFWeights, spec: Spec, data: DataFile) -> None:
        self.w, self.spec, self.data = weights, spec, data
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.checks = Checks()
        self.blocksums: dict[tuple[str, int], str] = {}
        self.shared: dict[str, str] = {}
        self.report: list[dict[str, Any]] = []
        self.cos_sin: tuple[str, ...] = ()
        self.native: Any = None   # gguf/native.py NativeOps: matrices on the project's GGUF-native ops

    # ---- primitives -----------------------------------------------------------------
    def node(self, op: str, inputs: list[str], name: str, n_out: int = 1, **attrs: Any) -> list[str]:
        from onnx import helper

        outs = [f"{name}/output_{i}" for i in range(n_out)]
        domain = "com.microsoft" if op in ("GroupQueryAttention", "SkipSimplifiedLayerNormalization",
                                           "MatMulNBits", "GatherBlockQuantized", "FastGelu") else \
            NATIVE_DOMAIN if op in (MATMUL_OP, GATHER_OP) else ""
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(self.data.tensor(name, list(array.shape), array.dtype, array))
        return name

    def const(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def shared_const(self, name: str, array: np.ndarray) -> str:
        """A small constant that several nodes use, written once."""
        if name not in self.shared:
            self.shared[name] = self.const(name, array)
        return self.shared[name]

    def blocksum(self, x: str, k: int, group: int) -> str:
        """x [B, S, K] summed over each block of ``group`` -> [B, S, K/group]: a Reshape and a
        ReduceSum, which read no weights (the 0/1 indicator MatMul read K*K/group*4 bytes a
        step: 92 MB per token on the 1B Q4_K_M; docs/scale.md, "Where decode time goes")."""
        if (x, group) not in self.blocksums:
            shape = self.shared_const(f"gguf.blocksum_shape.{k // group}x{group}",
                                      np.array([0, 0, k // group, group], np.int64))
            axis = self.shared_const("gguf.blocksum_axis", np.array([-1], np.int64))
            blocks = self.node("Reshape", [x, shape], f"{x}/gguf_blocksum{group}/Reshape")[0]
            self.blocksums[(x, group)] = self.node("ReduceSum", [blocks, axis], f"{x}/gguf_blocksum{group}",
                                                   keepdims=0)[0]
        return self.blocksums[(x, group)]

    # ---- layers ----------------------------------------------------------------------
    def linear(self, x: str, names: tuple[str, ...], name: str, keep_offset_rows: bool = False) -> tuple[str, Any]:
        """y = x @ W^T for the rows of ``names``; returns (y, the node's weights or None)."""
        base = name.strip("/").replace("/", ".")
        types = [self.w.qtype(n) for n in names]
        if self.native is not None and self.native.covers(self.w, names):
            return self.native.linear(self, x, names, name)   # the file's rows on GgufMatMul
        if is_float(self.w, names):
            w = dense_rows(self.w, names)
            wt = self.init(f"{base}.gguf_dense_t", np.ascontiguousarray(w.T))
            self.report.append({"node": name, "gguf": types, "bits": 32, "group": 0, "offsets": False})
            return self.node("MatMul", [x, wt], f"{name}/MatMul")[0], wt
        nw = write_node(self.data, self.w, names, base, self.checks, keep_offset_rows)
        self.inits += [nw.codes, nw.scales]
        y = self.node("MatMulNBits", [x, nw.codes.name, nw.scales.name], f"{name}/MatMul_Q4", K=nw.k, N=nw.n,
                      bits=nw.bits, block_size=nw.group, accuracy_level=ACCURACY_LEVEL)[0]
        self.report.append({"node": name, "gguf": types, "bits": nw.bits, "group": nw.group,
                            "offsets": nw.offsets is not None})
        if nw.offsets is not None:
            self.inits.append(nw.offsets)
            low = self.node("MatMul", [self.blocksum(x, nw.k, nw.group), nw.offsets.name], f"{name}/gguf_min")[0]
            self.node("Add", [y, low], f"{name}/gguf_add")
        # the builder's output name: engine/lora.py finds each projection by it
        self.nodes[-1].output[0] = f"{name}/MatMul/output_0"
        return self.nodes[-1].output[0], nw

    def qkv(self, i: int, x: str) -> list[str]:
        """GroupQueryAttention's query/key/value inputs (packed q/k/v with "" "" when fused)."""
        p, a, s = f"blk.{i}", f"/model/layers.{i}/attn", self.spec
        qkv = tuple(f"{p}.attn_{t}.weight" for t in "qkv")
        biases = [f"{p}.attn_{t}.bias" for t in "qkv"]
        has_bias = all(b in self.w.tensors for b in biases)
        qk_norm = f"{p}.attn_q_norm.weight" in self.w.tensors
        if self.fusable(qkv):
            fused = self.linear(x, qkv, f"{a}/qkv_proj")[0]
            if has_bias:
                b = self.init(f"model.layers.{i}.attn.qkv_proj.bias", np.concatenate([vector(self.w, n) for n in biases]))
                fused = self.node("Add", [fused, b], f"{a}/qkv_proj/gguf_bias")[0]
            q_k_v = [fused, "", ""]
            if qk_norm:
                sizes = self.const(f"model.layers.{i}.attn.qkv_proj.gguf_split",
                                   np.array([s.heads * s.head_dim] + [s.kv_heads * s.head_dim] * 2, np.int64))
                q_k_v = self.node("Split", [fused, sizes], f"{a}/qkv_proj/gguf_split", n_out=3, axis=-1)
        else:   # Q4_K q/k beside Q6_K v: three nodes at their own widths, none widened
            q_k_v = [self.linear(x, (n,), f"{a}/{t}_proj")[0] for n, t in zip(qkv, "qkv")]
            if has_bias:
                q_k_v = [self.node("Add", [y, self.init(f"model.layers.{i}.attn.{t}_proj.bias", vector(self.w, b))],
                                   f"{a}/{t}_proj/gguf_bias")[0] for y, t, b in zip(q_k_v, "qkv", biases)]
        if qk_norm:
            q_k_v[:2] = [self.head_norm(y, f"{p}.attn_{t}_norm.weight", f"{a}/{t}_norm") for y, t in zip(q_k_v, "qk")]
        return list(q_k_v)

    def attention(self, i: int, x: str, seqlens: str, total: str) -> str:
        p, a, s = f"blk.{i}", f"/model/layers.{i}/attn", self.spec
        out = self.node("GroupQueryAttention",
                        [*self.qkv(i, x), f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total,
                         *self.caches(i)],
                        f"{a}/GroupQueryAttention", n_out=3, num_heads=s.heads,
                        kv_num_heads=s.kv_heads, do_rotary=1, rotary_interleaved=0, **self.gqa_attrs(i))
        self.nodes[-1].output[1:] = [f"present.{i}.key", f"present.{i}.value"]
        return self.linear(out[0], (f"{p}.attn_output.weight",), f"{a}/o_proj")[0]

    def fusable(self, names: tuple[str, ...]) -> bool:
        """One node for these row sets: one block type on the native ops, else one MatMulNBits layout."""
        if self.native is not None and self.native.covers(self.w, names):
            return self.native.fusable(self.w, names)
        return len({common_layout(self.w, (n,)) if not is_float(self.w, (n,)) else "f" for n in names}) == 1

    # ---- hooks a family overrides (gguf_families.FamilyWriter) ------------------------------
    def gqa_attrs(self, i: int) -> dict[str, Any]:
        return {"scale": 1.0 / math.sqrt(self.spec.head_dim), "local_window_size": -1, "softcap": 0.0}

    def rotary(self) -> None:
        w = self.w
        factors = vector(w, "rope_freqs.weight") if "rope_freqs.weight" in w.tensors else None
        scaling, magnitude = rope_divisors(w, self.spec.rope_dim, self.spec.theta)   # linear or YaRN
        if scaling is not None:
            factors = scaling if factors is None else factors * scaling
        caches = rotary_caches(self.spec, factors)
        self.cos_sin = tuple(self.init(n, a * np.float32(magnitude)) for n, a in zip(("cos_cache", "sin_cache"), caches))

    def caches(self, i: int) -> tuple[str, ...]:
        return self.cos_sin

    def activation(self, gate: str, m: str) -> str:
        sig = self.node("Sigmoid", [gate], f"{m}/act_fn/Sigmoid")[0]
        return self.node("Mul", [gate, sig], f"{m}/act_fn/Mul")[0]

    def scale_embedding(self, x: str) -> str:
        return x

    def post_norm(self, i: int, kind: str, x: str) -> str:
        return x

    def final_logits(self, logits: str) -> str:
        return logits

    def head_norm(self, x: str, gguf_name: str, name: str) -> str:
        """RMS norm over each head's vector (qwen3's q_norm/k_norm): [B, S, H*D] -> same."""
        d = self.spec.head_dim
        per_head = self.const(f"{name}.gguf_shape".strip("/"), np.array([0, 0, -1, d], np.int64))
        flat = self.const(f"{name}.gguf_flat".strip("/"), np.array([0, 0, -1], np.int64))
        h = self.node("Reshape", [x, per_head], f"{name}/Reshape")[0]
        wname = self.init(name.strip("/").replace("/", ".") + ".weight", vector(self.w, gguf_name))
        h = self.node("SimplifiedLayerNormalization", [h, wname], f"{name}/LayerNorm", axis=-1,
                      epsilon=self.spec.eps, stash_type=1)[0]
        return self.node("Reshape", [h, flat], f"{name}/Reshape_back")[0]

    def mlp(self, i: int, x: str) -> str:
        p, m = f"blk.{i}", f"/model/layers.{i}/mlp"
        gate_up = (f"{p}.ffn_gate.weight", f"{p}.ffn_up.weight")
        if not is_float(self.w, gate_up) and self.fusable(gate_up):
            fused = self.linear(x, gate_up, f"{m}/gate_up_proj")[0]
            sizes = self.const(f"model.layers.{i}.mlp.gate_up_proj.gguf_split", np.array([self.spec.ffn] * 2, np.int64))
            gate, up = self.node("Split", [fused, sizes], f"{m}/gate_up_proj/gguf_split", n_out=2, axis=-1)
        else:
            gate = self.linear(x, gate_up[:1], f"{m}/gate_proj")[0]
            up = self.linear(x, gate_up[1:], f"{m}/up_proj")[0]
        h = self.node("Mul", [self.activation(gate, m), up], f"{m}/Mul")[0]
        return self.linear(h, (f"{p}.ffn_down.weight",), f"{m}/down_proj")[0]

    def norm(self, name: str, gguf_name: str, x: str, skip: str | None) -> tuple[str, str]:
        """(normed, residual sum) with the builder's fused Skip-norm where there is a skip."""
        wname = self.init(name.strip("/").replace("/", ".") + ".weight", vector(self.w, gguf_name))
        if skip is None:
            return self.node("SimplifiedLayerNormalization", [x, wname], f"{name}/LayerNorm", axis=-1,
                             epsilon=self.spec.eps, stash_type=1)[0], x
        outs = self.node("SkipSimplifiedLayerNormalization", [skip, x, wname], f"{name}/SkipLayerNorm",
                         n_out=4, epsilon=self.spec.eps)
        self.nodes[-1].output[1:3] = ["", ""]
        return outs[0], outs[3]

    # ---- whole model -------------------------------------------------------------------
    def mask_inputs(self) -> tuple[str, str]:
        """seqlens_k = sum(mask) - 1 and total_sequence_length, int32, as GQA wants them."""
        from onnx import TensorProto

        one = self.const("/model/constants/INT64/[1]", np.array([1], np.int64))
        idx = self.const("/model/constants/INT64/1", np.array(1, np.int64))
        g = "/model/attn_mask_reformat/attn_mask_subgraph"
        total = self.node("ReduceSum", ["attention_mask", one], f"{g}/ReduceSum", keepdims=0)[0]
        sub = self.node("Sub", [total, idx], f"{g}/Sub")[0]
        seqlens = self.node("Cast", [sub], f"{g}/Sub/Cast", to=TensorProto.INT32)[0]
        shape = self.node("Shape", ["attention_mask"], f"{g}/Shape")[0]
        width = self.node("Gather", [shape, idx], f"{g}/Gather", axis=0)[0]
        return seqlens, self.node("Cast", [width], f"{g}/Gather/Cast", to=TensorProto.INT32)[0]

    def embedding(self, head: Any) -> str:
        """Token embeddings: the LM head's own blocks when tied, else token_embd's."""
        name = "token_embd.weight"
        native = self.native.embedding(self, head) if self.native is not None else None
        if native is not None:
            return native
        if self.spec.tied and head is not None:
            nw = head
        elif is_float(self.w, (name,)):
            nw = None
        else:
            nw = write_node(self.data, self.w, (name,), "model.embed_tokens", self.checks, keep_offset_rows=True)
            self.inits += [nw.codes, nw.scales]
        if nw is None or isinstance(nw, str):
            table = self.init("model.embed_tokens.gguf_dense", dense_rows(self.w, (name,))) if nw is None else \
                self.node("Transpose", [nw], "/model/embed_tokens/gguf_transpose", perm=[1, 0])[0]
            return self.node("Gather", [table, "input_ids"], "/model/embed_tokens/Gather")[0]
        flat = self.const(f"{nw.codes.name}/flat_shape", np.array([nw.n, nw.k * nw.bits // 8], np.int64))
        codes = self.node("Reshape", [nw.codes.name, flat], "/model/embed_tokens/Reshape")[0]
        x = self.node("GatherBlockQuantized", [codes, "input_ids", nw.scales.name],
                      "/model/embed_tokens/GatherBlockQuantized", bits=nw.bits, block_size=nw.group,
                      gather_axis=0, quantize_axis=1)[0]
        if nw.offsets_rows is None:
            return x
        # the minimum of each block: gather its offsets, spread each over its block, add
        table = self.init("model.embed_tokens.gguf_offset_rows", nw.offsets_rows)
        per_block = self.node("Gather", [table, "input_ids"], "/model/embed_tokens/gguf_offsets")[0]
        spread = self.init(f"gguf.block_spread.{nw.k // nw.group}x{nw.k}", _spread(nw.k, nw.group))
        low = self.node("MatMul", [per_block, spread], "/model/embed_tokens/gguf_min")[0]
        return self.node("Add", [x, low], "/model/embed_tokens/gguf_add")[0]

    def build(self) -> Any:
        """The decoder graph (ModelProto without weight data; the data is already written)."""
        from onnx import helper

        s = self.spec
        self.rotary()
        seqlens, total = self.mask_inputs()
        head_names = ("output.weight",) if not s.tied else ("token_embd.weight",)
        # the LM head is written first so a tied embedding can share its blocks
        head_x = "/model/layers.final/final_norm/output_0"
        logits_src, head = self.linear(head_x, head_names, "/lm_head", keep_offset_rows=s.tied)
        head_nodes, self.nodes = self.nodes, []
        x = self.scale_embedding(self.embedding(head))
        skip = None
        for i in range(s.layers):
            h, skip = self.norm(f"/model/layers.{i}/input_layernorm", f"blk.{i}.attn_norm.weight", x, skip)
            x = self.post_norm(i, "attn", self.attention(i, h, seqlens, total))
            h, skip = self.norm(f"/model/layers.{i}/post_attention_layernorm", f"blk.{i}.ffn_norm.weight", x, skip)
            x = self.post_norm(i, "ffn", self.mlp(i, h))
        final, _ = self.norm("/model/layers.final/final_norm", "output_norm.weight", x, skip)
        self.rename(final, head_x)
        self.nodes += head_nodes
        self.rename(self.final_logits(logits_src), "logits")
        domains = [("", 21), ("com.microsoft", 1)] + ([(NATIVE_DOMAIN, NATIVE_OPSET)] if self.native and self.native.nodes else [])
        return helper.make_model(self.graph(), opset_imports=[helper.make_opsetid(d, v) for d, v in domains],
                                 ir_version=10, producer_name="ortserve-gguf")

    def rename(self, old: str, new: str) -> None:
        for n in self.nodes:
            for seq in (n.input, n.output):
                for j, v in enumerate(seq):
                    if v == old:
                        seq[j] = new

    def graph(self) -> Any:
        from onnx import TensorProto, helper

        s = self.spec
        kv: list[str | int | None] = ["batch_size", s.kv_heads, None, s.head_dim]
        inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
                  helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                ["batch_size", "total_sequence_length"])]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                 ["batch_size", "sequence_length", s.vocab])]
        for i in range(s.layers):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", TensorProto.FLOAT,
                                                            [*kv[:2], "past_sequence_length", kv[3]]))
                outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT,
                                                             [*kv[:2], "total_sequence_length", kv[3]]))
        return helper.make_graph(self.nodes, "main_graph", inputs, outputs, self.inits)


def _spread(k: int, group: int) -> np.ndarray:
    """0/1 [K/group, K]: per-block values @ it repeat each over its block (exact)."""
    eye = np.zeros((k // group, k), np.float32)
    eye[np.arange(k) // group, np.arange(k)] = 1.0
    return eye
