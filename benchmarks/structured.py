"""Constrained decoding cost: decode tok/s with a 5-tool grammar against unconstrained decoding
on the same prompt, at 1 and 16 concurrent streams, sides alternating rep by rep in one run;
plus grammar compile time (cold, then cached) and the mask time per token.

    python benchmarks/structured.py [--model DIR] [--reps 3] [--tokens 64]

Both sides render the same prompt (the tools described in the system prompt) and run at
temperature 0.7 with the same seeds; the only difference is the grammar mask. Decode tok/s
counts output tokens after the first over the time after the first token (TTFT excluded),
summed over the concurrent streams.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import QUESTIONS, emit, machine, median, model_dir

TOOLS = [{"type": "function", "function": {"name": name, "description": desc, "parameters": {
    "type": "object", "properties": props, "required": list(props), "additionalProperties": False}}}
    for name, desc, props in [
        ("get_weather", "Weather in a city", {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}),
        ("search_web", "Search the web", {"query": {"type": "string"}, "top_k": {"type": "integer"}}),
        ("send_email", "Send an email", {"to": {"type": "string"}, "subject": {"type": "string"},
                                         "body": {"type": "string"}}),
        ("create_event", "Add a calendar event", {"title": {"type": "string"}, "date": {"type": "string"},
                                                  "attendees": {"type": "array", "items": {"type": "string"}}}),
        ("convert_currency", "Convert money", {"amount": {"type": "number"}, "from": {"type": "string"},
                                               "to": {"type": "string"}}),
    ]]


def decode_rate(outs: list[Any]) -> float:
    """Output tokens after the first / decode time, summed over the streams."""
    return sum(o.metrics.output_tokens_per_second for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()

    from ortserve.engine import LLM
    from ortserve.engine.guidance import Constraint, Guidance
    from ortserve.engine.tools import parse_tools, tool_grammar
    from ortserve.types import SamplingParams

    path, model_id = model_dir(args.model)
    tools = parse_tools(TOOLS)
    grammar = tool_grammar(tools, "required")
    assert grammar is not None

    # compile time: a fresh Guidance (tokenizer load counted apart), cold then cached
    with LLM(path) as llm:
        g = Guidance(path / "tokenizer.json", llm.engine.model.spec.vocab_size, llm.engine.model.spec.eos_token_ids)
        t0 = time.perf_counter()
        _ = g.tokenizer
        tokenizer_s = time.perf_counter() - t0
        cold, cached = [], []
        for i in range(5):  # distinct content each time: a cold compile, then a cache hit
            c = Constraint("grammar", grammar + f"\n// {i}\n")
            t0 = time.perf_counter()
            g.guide(c)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            g.guide(c)
            cached.append(time.perf_counter() - t0)

        prompts = [llm.engine.codec.render_chat([{"role": "user", "content": q}], tools=tools)
                   for q in QUESTIONS]
        llm.generate(prompts[:2], SamplingParams(max_tokens=8, grammar=grammar), progress=False)  # warm-up
        results: dict[str, dict[str, list[float]]] = {}
        core = llm.engine.core
        for streams in (1, 16):
            free, guided = [], []
            mask_waits, tokens_guided = 0.0, 0
            for rep in range(args.reps):
                batch = [prompts[(rep + i) % len(prompts)] for i in range(streams)]
                for side in (("free", "guided") if rep % 2 == 0 else ("guided", "free")):
                    params = SamplingParams(temperature=0.7, seed=rep, max_tokens=args.tokens,
                                            grammar=grammar if side == "guided" else None)
                    before = core.mask_seconds
                    outs = llm.generate(batch, params, progress=False)
                    (guided if side == "guided" else free).append(decode_rate(outs))
                    if side == "guided":
                        mask_waits += core.mask_seconds - before
                        tokens_guided += sum(o.metrics.output_tokens for o in outs)
            results[str(streams)] = {"free_tok_s": free, "guided_tok_s": guided,
                                     "mask_wait_ms_per_token": [1000 * mask_waits / max(tokens_guided, 1)]}

    report: dict[str, Any] = {"benchmark": "structured", "model": model_id, "machine": machine(),
                              "tokens": args.tokens, "reps": args.reps, "tools": len(TOOLS),
                              "tokenizer_load_s": round(tokenizer_s, 3),
                              "compile_cold_ms": round(1000 * median(cold), 3),
                              "compile_cached_ms": round(1000 * median(cached), 4)}
    for streams, r in results.items():
        f, gd = median(r["free_tok_s"]), median(r["guided_tok_s"])
        report[f"streams_{streams}"] = {
            "unconstrained_decode_tok_s": round(f, 1), "five_tool_grammar_decode_tok_s": round(gd, 1),
            "ratio": round(gd / f, 3) if f else None, "goal": 0.90,
            "mask_wait_ms_per_token": round(r["mask_wait_ms_per_token"][0], 4)}
    emit(report)


if __name__ == "__main__":
    main()
