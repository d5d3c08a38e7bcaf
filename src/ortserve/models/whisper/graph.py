"""Edits to the Whisper encoder the ONNX GenAI builder writes: its matrix products in int8.

The builder fuses each encoder layer's self-attention into one com.microsoft ``Attention`` node
that holds the Q, K, V projection weight in fp32 (``-p int8`` quantizes only the MatMuls it writes
as MatMuls, as 8-bit ``MatMulNBits``). CTranslate2 runs all of them as int8 GEMMs. Measured on this
machine's CPU (AMD EPYC, AVX-512 VNNI, 2 threads, 1500 x 512 x 2048, CPU ms): fp32 MatMul 34.6,
MatMulNBits 8-bit (accuracy_level 4) 24.3, ``DynamicQuantizeMatMul`` 9.7 (MLAS's u8 x s8 GEMM).
So ``int8_encoder`` makes the attention's projections ``DynamicQuantizeMatMul``: the activations
quantized per tensor as the node runs (u8), the weights per output column, symmetric and 7-bit
(int8 storage, |q| <= 63). Why 7 bits: on AVX2 CPUs without VNNI, MLAS's u8 x s8 kernel adds byte
products in pairs with ``vpmaddubsw``, whose int16 sums saturate once both are large (255 * 127 * 2 >
32767), silently; with |q| <= 64 a pair is at most 255 * 64 * 2 = 32640. The model folder is the
same on every CPU, so the weights are safe on all of them. u8 weights with a zero point (MLAS's u8 x
u8 path, no ``vpmaddubsw``) took 2.3x the CPU of s7 on one 1500 x 512 x 1536 product here, 1.1x on
the whole encoder; s7 the same as s8 (docs/audio.md). Each
``Attention`` becomes the QKV projection (with its bias), a ``Split`` and ``MultiHeadAttention`` on
the projected Q, K and V; the output and cross-attention K/V ``MatMulNBits`` are dequantized and
quantized again per column. The MLP's fc1 and fc2 stay ``MatMulNBits``, whose activations are
quantized per block of 32: per tensor, either one changed "heavy rain in" into "and re-raining"
(tests/integration/test_whisper_base.py's two sentences). Encoder CPU per 30 s window, 2 threads:
1.05 s as built, 0.85 s so, 0.65 s with the MLP too (docs/audio.md).

``native_q8`` then moves the encoder's MLP and the decoder's LM head, where the native GGUF kernels
are active (``ortserve.native``), onto ``ortserve.gguf::GgufMatMul`` over Q8_0 rows: the same 8-bit
weights (the fp32 block scale rounded to fp16: half an fp16 step, under the 8-bit step the weights
carry; a matrix with a scale fp16 cannot hold stays ``MatMulNBits``), activations quantized per block of 32 as
``MatMulNBits``' accuracy level 4 does, so the words are those of the as-built MLP. On this machine's
2 cores (AVX-512 VNNI, CPU ms): fc1 1500 x 512 x 2048 25.0 -> 16.1, fc2 22.9 -> 15.5, the LM head
1 x 512 x 51865 1.76 -> 1.27; the decoder's own small projections stay ``MatMulNBits`` (0.052 ms
against the native op's 0.072 at 512 x 2048, one row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ortserve.native import DOMAIN, TYPE_IDS, ensure_domain

VERSION = 4          # bump when the rewrite changes: imports made before are redone (importer.py)
ATTENTION = ("/attn/",)   # the builder's names of the attention projections (o_proj, cross k/v)


NATIVE_ENCODER = ("/mlp/",)    # the encoder's matrices native_q8 moves (the MLP's fc1 and fc2)
NATIVE_DECODER = ("/lm_head/",)
Q8_0 = TYPE_IDS["Q8_0"]


WEIGHT_MAX = 63     # |q| of the weights: u8 x s7 pair sums fit vpmaddubsw's int16 (255 * 64 * 2 < 32767)


def per_column_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) fp32 as symmetric 7-bit integers in int8 (|q| <= WEIGHT_MAX), one scale per column (N,)."""
    scale = np.abs(w).max(axis=0) / float(WEIGHT_MAX)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(w / scale), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8)
    return q, scale.astype(np.float32)


def dequantize_nbits8(q: np.ndarray, scales: np.ndarray, k: int, n: int, block: int) -> np.ndarray:
    """MatMulNBits 8-bit without zero points ((N, blocks, block) uint8 around 128) back to (K, N) fp32."""
    blocks = q.reshape(n, -1, block).astype(np.float32) - 128.0
    return (blocks * scales.reshape(n, -1, 1)).reshape(n, -1)[:, :k].T.copy()


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def int8_encoder(encoder: Path, only: tuple[str, ...] = ATTENTION) -> int:
    """Rewrite ``encoder`` (and its external data file) in place; the number of nodes rewritten.
    Only the ``MatMulNBits`` whose names contain one of ``only`` are rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(encoder))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    used = [i for n in g.node for i in n.input]

    def take(name: str) -> np.ndarray:
        value = numpy_helper.to_array(inits[name])
        if used.count(name) == 1:
            g.initializer.remove(inits.pop(name))
        return value

    def int8_matmul(x: str, w: np.ndarray, out: str, base: str, bias: str = "") -> Any:
        q, scale = per_column_int8(w)
        g.initializer.extend([numpy_helper.from_array(q, f"{base}.weight_int8"),
                              numpy_helper.from_array(scale, f"{base}.weight_scale")])
        return helper.make_node("DynamicQuantizeMatMul", [x, f"{base}.weight_int8", f"{base}.weight_scale", "", bias],
                                [out], name=f"{base}/DynamicQuantizeMatMul", domain="com.microsoft")

    nodes: list[Any] = []
    done = 0
    for node in g.node:
        a = _attrs(node)
        if (node.op_type == "Attention" and node.domain == "com.microsoft" and node.input[1] in inits
                and not any(node.input[3:]) and not a.get("do_rotary") and not a.get("unidirectional")
                and len(set(a.get("qkv_hidden_sizes") or [0])) == 1):
            base = node.name or node.output[0]
            w = take(node.input[1])
            bias = node.input[2] if len(node.input) > 2 else ""
            qkv = [f"{base}/{p}/output_0" for p in "qkv"]
            sizes = f"{base}.qkv_split"
            g.initializer.append(numpy_helper.from_array(np.array([w.shape[1] // 3] * 3, np.int64), sizes))
            mha = {"num_heads": a["num_heads"], **({"scale": a["scale"]} if a.get("scale") else {})}
            nodes += [int8_matmul(node.input[0], w, f"{base}/qkv/output_0", f"{base}/qkv", bias),
                      helper.make_node("Split", [f"{base}/qkv/output_0", sizes], qkv, name=f"{base}/qkv/Split", axis=-1),
                      helper.make_node("MultiHeadAttention", qkv, [node.output[0]], name=f"{base}/MultiHeadAttention",
                                       domain="com.microsoft", **mha)]
        elif (node.op_type == "MatMulNBits" and any(k in node.name for k in only) and a.get("bits") == 8 and len(node.input) == 3
              and node.input[1] in inits and node.input[2] in inits):
            w = dequantize_nbits8(take(node.input[1]), take(node.input[2]), a["K"], a["N"], a["block_size"])
            nodes.append(int8_matmul(node.input[0], w, node.output[0], node.name or node.output[0]))
        else:
            nodes.append(node)
            continue
        done += 1
    if done:
        del g.node[:]
        g.node.extend(nodes)
        _save(model, encoder)
    return done


def _save(model: Any, path: Path) -> None:
    """Write ``model`` over ``path``, its tensors in a fresh ``<name>.data`` beside it."""
    import onnx

    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=data.name, size_threshold=1024)
    data.chmod(0o644)


def q8_0_rows(q: np.ndarray, scales: np.ndarray) -> np.ndarray | None:
    """MatMulNBits 8-bit blocks ((N, blocks, 32) uint8 around 128, (N, blocks) fp32 scales) as
    GGUF Q8_0 rows (N, blocks * 34): per block an fp16 scale then 32 int8. None when a scale does
    fp16 cannot hold (overflow). fp16 rounds a scale by at most half its unit in the last place:
    2^-11 relative, or 2^-25 absolute for the subnormal scales of near-zero blocks (the builder's
    fc2 has ~16k of them per layer, up to 1.5e-3 relative there), each under the half 8-bit step
    (1/254 of the block's largest weight) that the weights already carry."""
    n, blocks, block = q.shape
    if block != 32:
        return None
    s = scales.reshape(n, blocks).astype(np.float32)
    with np.errstate(over="ignore"):     # a scale past fp16's range becomes inf: refused just below
        d = s.astype(np.float16)
    if not np.all(np.isfinite(d)) or np.any(np.abs(d.astype(np.float32) - s) > np.maximum(np.abs(s) * 2.0 ** -11, 2.0 ** -25)):
        return None
    qs = (q.astype(np.int16) - 128).astype(np.int8)
    return np.concatenate([d.view(np.uint8).reshape(n, blocks, 2), qs.view(np.uint8)], axis=2).reshape(n, blocks * 34)


def native_q8(path: Path, only: tuple[str, ...]) -> int:
    """Rewrite ``path`` (and its external data) in place: each 8-bit ``MatMulNBits`` of block 32
    without zero points or bias whose name contains one of ``only`` becomes a ``GgufMatMul`` on Q8_0
    rows. The number of nodes rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    used = [i for n in g.node for i in n.input]
    done = 0
    for node in g.node:
        a = _attrs(node)
        if not (node.op_type == "MatMulNBits" and any(k in node.name for k in only) and a.get("bits") == 8
                and a.get("block_size") == 32 and a["K"] % 32 == 0 and not any(node.input[3:])
                and node.input[1] in inits and node.input[2] in inits
                and used.count(node.input[1]) == used.count(node.input[2]) == 1):
            continue
        rows = q8_0_rows(numpy_helper.to_array(inits[node.input[1]]), numpy_helper.to_array(inits[node.input[2]]))
        if rows is None:
            continue
        base = (node.name or node.output[0]).strip("/").replace("/", ".")
        for name in node.input[1:3]:
            g.initializer.remove(inits.pop(name))
        g.initializer.append(numpy_helper.from_array(rows, f"{base}.q8_0_rows"))
        new = helper.make_node("GgufMatMul", [node.input[0], f"{base}.q8_0_rows"], list(node.output),
                               name=node.name.replace("MatMul_Q8", "MatMul_Gguf"), domain=DOMAIN,
                               ggml_type=Q8_0, K=a["K"], N=a["N"])
        node.CopyFrom(new)
        done += 1
    if done:
        ensure_domain(model)
        _save(model, path)
    return done
