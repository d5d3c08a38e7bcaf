"""Two model folders' engines (say, one library before a change and one after), 16 parallel streams
each, alternating in one process (prints JSON).

    .venv/bin/python benchmarks/parallel_ab.py --a /tmp/1b-before --b /tmp/1b-after \
        [--streams 16] [--gen 128] [--reps 3] [--threads 2] [--spin]

Both folders hold the same graph; what differs is what they load (the custom-op library beside
the graph, docs/native.md). Each rep runs ``streams`` concurrent greedy requests of ``gen`` tokens
(``vs_llamacpp.py``'s prompts and its aggregate decode tokens/s) on A, then on B, so load changes
hit both; ``b_over_a`` is the per-rep ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from _common import emit_with_load, median, result_head, runtime_args
from vs_llamacpp import engine_parallel, heldout_text, parallel_prompts

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="model folder A (the baseline)")
    ap.add_argument("--b", required=True, help="model folder B")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    runtime_args(ap)
    args = ap.parse_args()
    n = args.streams
    settings = load_settings(max_batch=n, intra_op_threads=args.threads, thread_spinning=args.spin)
    engines = {k: AsyncEngine.load(p, settings) for k, p in (("a", args.a), ("b", args.b))}
    prompts = parallel_prompts(engines["a"], engines["a"].codec.encode(heldout_text(), add_special_tokens=False), n)
    result = result_head("parallel_ab", args, a=args.a, b=args.b, streams=n, gen=args.gen)

    async def run() -> None:
        for e in engines.values():
            await e.start()
            await engine_parallel(e, prompts, 8)  # warm-up
        tps: dict[str, list[float]] = {"a": [], "b": []}
        loads = []
        for _ in range(args.reps):
            loads.append(os.getloadavg()[0])
            for k, e in engines.items():
                tps[k].append(await engine_parallel(e, prompts, args.gen))
        for e in engines.values():
            await e.stop()
        ratios = [b / a for a, b in zip(tps["a"], tps["b"])]
        result.update({"tokens_per_second": tps, "b_over_a": ratios, "b_over_a_median": median(ratios),
                       "loadavg_per_rep": loads})

    asyncio.run(run())
    emit_with_load(result)


if __name__ == "__main__":
    main()
