r"""Would decode rows riding in a prompt chunk's run lift issue 18's long-prompt bound? (JSON)

    flock /work/bench.lock nice -n -10 .venv/bin/python benchmarks/mixed_step.py [--model ID] \
        [--rows 8] [--prompt 4096] [--at 2048] [--chunks 16,32,64,128,512] [--reps 7]

vLLM and llama-server put the decode tokens of running streams into the same forward pass as
a prefill chunk, so the weights are read once for both. ortserve's graph takes a rectangular
batch, so its steps run a decode call and a chunk call one after the other. This script builds
the *mixed* graph (below: tokens flattened to ``[1, rows + c]``, every token-wise node shared,
GroupQueryAttention split into a decode half and a chunk half, logits only where asked),
checks that it is exact (logits and KV cache identical to the two separate calls), and
measures what it saves: CPU time per step with one intra-op thread and no spinning
(``time.process_time``, so other load on the machine does not count as ours), alternating the
two forms for ``--reps`` repetitions at each chunk size, with the chunk row ``--at`` tokens
into a ``--prompt``-token prompt.

From the medians it applies docs/robustness.md's cost model: at each chunk size c, a step that
decodes the rows and prefills c tokens makes the streams' TPOT ``step / decode alone`` and the
long prompt's TTFT ``(prompt / c) x step`` against its idle prefill in 512-token chunks.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, machine, median, model_dir

from ortserve.engine.graph import lm_head
from ortserve.engine.huge_pages import anon_mappings, use_huge_pages
from ortserve.engine.runner import ModelSpec, Runner


def mixed_step_graph(onnx_path: Path) -> bytes:
    """The decoder edited so that one run decodes ``n`` rows *and* prefills a chunk of one more.

    ``input_ids`` is ``[1, n + c]`` (the n decode tokens, then the chunk): embedding, norms,
    linears and MLP read their weights once for both. Each GroupQueryAttention node is split:
    the first n tokens, reshaped to ``[n, 1]``, attend with the decode rows' cache
    (``attention_mask`` ``[n, total]``, ``past_key_values.*``, as the builder's graph), the chunk
    with its own row (``chunk_attention_mask`` ``[1, start + c]``, ``chunk_past_key_values.*``
    -> ``chunk_present.*``); the outputs are concatenated back. ``logit_index`` ``[K]`` picks the
    positions whose logits come out (``[1, K, vocab]``).
    """
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(onnx_path), load_external_data=False)
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    head = lm_head(graph)
    if (not gqa or "position_ids" in inputs or head is None
            or any(n.input[1] or n.input[2] or n.input[5:7] != gqa[0].input[5:7] for n in gqa)):
        raise SystemExit(f"{onnx_path}: not the builder's packed-QKV GroupQueryAttention layout")

    p = "mixed/"
    inits: list[Any] = []

    def const(name: str, values: list[int], dims: list[int] | None = None) -> str:
        inits.append(helper.make_tensor(p + name, TensorProto.INT64, [len(values)] if dims is None else dims,
                                        values))
        return p + name

    one, axis1, big, zero = const("one", [1]), const("axis1", [1]), const("big", [2**62]), const("zero", [0])
    to_rows, to_flat, idx1 = const("to_rows", [-1, 1, 0]), const("to_flat", [1, -1, 0]), const("idx1", [1], [])
    new = [  # the chunk row's seqlens_k and total length, as the builder computes them from attention_mask
        helper.make_node("ReduceSum", ["chunk_attention_mask", axis1], [p + "c_sum"], keepdims=0),
        helper.make_node("Sub", [p + "c_sum", one], [p + "c_sub"]),
        helper.make_node("Cast", [p + "c_sub"], [p + "c_seqlens"], to=TensorProto.INT32),
        helper.make_node("Shape", ["chunk_attention_mask"], [p + "c_shape"]),
        helper.make_node("Gather", [p + "c_shape", idx1], [p + "c_total64"], axis=0),
        helper.make_node("Cast", [p + "c_total64"], [p + "c_total"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], [p + "n"], start=0, end=1),
    ]
    split: dict[str, list[Any]] = {}
    kv_in: list[str] = []
    kv_out: list[str] = []
    for node in gqa:
        q = p + node.name + "/"
        dec = helper.make_node("GroupQueryAttention", [q + "qkv_d", "", "", *node.input[3:]],
                               [q + "out_d", *node.output[1:]], name=node.name + "/decode", domain=node.domain)
        chunk_io = [f"chunk_{node.input[3]}", f"chunk_{node.input[4]}", p + "c_seqlens", p + "c_total"]
        chk = helper.make_node("GroupQueryAttention", [q + "qkv_c", "", "", *chunk_io, *node.input[7:]],
                               [q + "out_c", *(f"chunk_{o}" for o in node.output[1:])],
                               name=node.name + "/chunk", domain=node.domain)
        dec.attribute.extend(node.attribute)
        chk.attribute.extend(node.attribute)
        qkv = node.input[0]
        split[node.name] = [
            helper.make_node("Slice", [qkv, zero, p + "n", axis1], [q + "qkv_d_flat"]),
            helper.make_node("Reshape", [q + "qkv_d_flat", to_rows], [q + "qkv_d"]),
            helper.make_node("Slice", [qkv, p + "n", big, axis1], [q + "qkv_c"]),
            dec, chk,
            helper.make_node("Reshape", [q + "out_d", to_flat], [q + "out_d_flat"]),
            helper.make_node("Concat", [q + "out_d_flat", q + "out_c"], [node.output[0]], axis=1),
        ]
        kv_in += node.input[3:5]
        kv_out += node.output[1:]
    picked = head.input[0] + "/picked"
    gather = helper.make_node("Gather", [head.input[0], "logit_index"], [picked], axis=1, name=p + "pick")
    head.input[0] = picked
    nodes = list(new)
    for node in graph.node:
        if node is head:
            nodes.append(gather)
        nodes.extend(split.get(node.name, [node]) if node.op_type == "GroupQueryAttention" else [node])
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(inits)

    def like(src: Any, name: str) -> Any:
        dims = [d.dim_param or d.dim_value for d in src.type.tensor_type.shape.dim]
        return helper.make_tensor_value_info(name, src.type.tensor_type.elem_type, ["chunk_rows", *dims[1:]])

    outputs = {o.name: o for o in graph.output}
    graph.input.extend(like(inputs[n], f"chunk_{n}") for n in kv_in)
    graph.output.extend(like(outputs[n], f"chunk_{n}") for n in kv_out)
    graph.input.append(helper.make_tensor_value_info(
        "chunk_attention_mask", inputs["attention_mask"].type.tensor_type.elem_type, [1, "chunk_total"]))
    graph.input.append(helper.make_tensor_value_info("logit_index", TensorProto.INT64, ["picked"]))
    dim = outputs["logits"].type.tensor_type.shape.dim[1]
    dim.Clear()
    dim.dim_param = "picked"
    return bytes(model.SerializeToString())


def options(ort: Any, folder: Path | None = None) -> Any:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if folder is not None:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    return so


def mixed_run(sess: Any, r: Runner, toks: np.ndarray, chunk: list[int], start: int) -> np.ndarray:
    """Decode rows 0..n-1 and prefill ``chunk`` into row n, in one session run."""
    n = len(toks)
    mask = (np.arange(int(r.lengths[:n].max()) + 1)[None, :] <= r.lengths[:n, None]).astype(r.mask_dtype)
    io = sess.io_binding()
    for layer in range(r.spec.layers):
        for j, kind in enumerate(("key", "value")):
            for prefix, rows, first in (("", n, 0), ("chunk_", 1, n)):
                shape, ptr = (rows, *r.kv.shape[1:]), r.kv.pointer(2 * layer + j, first)
                io.bind_input(f"{prefix}past_key_values.{layer}.{kind}", "cpu", 0, r.dtype, shape, ptr)
                io.bind_output(f"{prefix}present.{layer}.{kind}", "cpu", 0, r.dtype, shape, ptr)
    io.bind_cpu_input("input_ids", np.asarray([[*toks, *chunk]], dtype=r.ids_dtype))
    io.bind_cpu_input("attention_mask", mask)
    io.bind_cpu_input("chunk_attention_mask", np.ones((1, start + len(chunk)), dtype=r.mask_dtype))
    io.bind_cpu_input("logit_index", np.asarray([*range(n), n + len(chunk) - 1], dtype=np.int64))
    io.bind_output("logits", "cpu")
    sess.run_with_iobinding(io)
    r.lengths[:n] += 1
    r.lengths[n] = start + len(chunk)
    return io.get_outputs()[-1].numpy()[0].astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--at", type=int, default=2048, help="tokens of the long prompt already in its row")
    ap.add_argument("--chunks", default="16,32,64,128,512")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    import onnxruntime as ort

    path, model_id = model_dir(args.model)
    at_start = machine()
    spec = ModelSpec.read(path)
    chunks = [int(c) for c in args.chunks.split(",")]
    cap = args.prompt + 64
    sep = Runner(spec, slots=args.rows + 1, capacity=cap, session_options=options(ort))
    mix = Runner(spec, slots=args.rows + 1, capacity=cap, session_options=options(ort))
    # the Runners put their weights in huge pages (engine/runtime.py); the mixed session gets the
    # same, or the comparison would measure page size rather than the graph
    before = anon_mappings()
    sess = ort.InferenceSession(mixed_step_graph(spec.onnx_path), options(ort, spec.onnx_path.parent),
                                providers=["CPUExecutionProvider"])
    use_huge_pages(before)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, spec.vocab_size - 100, args.prompt)]
    toks = np.zeros(args.rows, dtype=np.int64)
    for r in (sep, mix):
        for i in range(args.rows):
            toks[i] = int(np.argmax(r.prefill(i, [int(t) for t in rng.integers(100, 40000, 100)])))
        r.prefill(args.rows, prompt[:args.at], total=args.prompt)
    mix.lengths[:] = sep.lengths  # the same cache contents in both (the random prompts differ per runner)
    for layer in range(2 * spec.layers):
        mix.kv.bufs[layer][...] = sep.kv.bufs[layer]

    # exactness: one mixed step against a decode call plus a chunk call
    c0 = chunks[0]
    want_d = sep.decode(toks.copy()).copy()
    want_c = sep.prefill(args.rows, prompt[args.at:args.at + c0], start=args.at, total=args.prompt).copy()
    got = mixed_run(sess, mix, toks, prompt[args.at:args.at + c0], args.at)
    kv_diff = max(float(np.abs(mix.kv.bufs[i] - sep.kv.bufs[i]).max()) for i in range(2 * spec.layers))
    exact = {"decode_logits_max_diff": float(np.abs(got[:args.rows] - want_d).max()),
             "chunk_logits_max_diff": float(np.abs(got[args.rows] - want_c).max()), "kv_max_diff": kv_diff}

    def reset() -> None:
        for r in (sep, mix):
            r.lengths[:args.rows] -= 1
            r.lengths[args.rows] = args.at

    def cpu(fn: Any) -> float:
        t0 = time.process_time()
        fn()
        return time.process_time() - t0

    rows: list[dict[str, Any]] = []
    reset()
    for c in chunks:
        piece = prompt[args.at:args.at + c]
        d_alone, c_alone, mixed = [], [], []
        for _ in range(args.reps):
            d_alone.append(cpu(lambda: sep.decode(toks.copy())))
            c_alone.append(cpu(lambda piece=piece: sep.prefill(args.rows, piece, start=args.at, total=args.prompt)))
            mixed.append(cpu(lambda piece=piece: mixed_run(sess, mix, toks, piece, args.at)))
            reset()
        rows.append({"chunk": c, "decode_ms": 1e3 * median(d_alone), "chunk_ms": 1e3 * median(c_alone),
                     "separate_ms": 1e3 * (median(d_alone) + median(c_alone)), "mixed_ms": 1e3 * median(mixed)})
    idle = next((r["chunk_ms"] / r["chunk"] for r in rows if r["chunk"] == 512), rows[-1]["chunk_ms"] / rows[-1]["chunk"])
    for r in rows:
        r["saved_ms"] = r["separate_ms"] - r["mixed_ms"]
        r["chunk_ms_per_token"] = r["chunk_ms"] / r["chunk"]
        for form in ("separate", "mixed"):
            step = r[f"{form}_ms"]
            r[f"{form}_tpot_x"] = step / r["decode_ms"]
            r[f"{form}_ttft_x"] = (args.prompt / r["chunk"]) * step / (args.prompt * idle)
    emit({"benchmark": "mixed_step", "model": model_id, "machine": at_start, "rows": args.rows,
          "prompt": args.prompt, "at": args.at, "threads": 1, "reps": args.reps,
          "idle_prefill_ms_per_token": idle, "exact": exact, "by_chunk": rows,
          "loadavg_at_end": list(os.getloadavg())})


if __name__ == "__main__":
    main()
