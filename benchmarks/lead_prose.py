"""What prose before a call costs the grammar under ``tool_choice: auto`` (docs/tools.md, "Prose
before a call"): the mask time per token while a model writes prose and then a call, with the grammar
that allows prose then calls against the earlier one that allowed prose **or** calls (the same prose
minus its first character's restriction), on real vocabularies in the same run.

    python benchmarks/lead_prose.py [--reps 5]

Qwen2's vocabulary (151,936 tokens, llama.cpp's vocab GGUF) with Hermes; Llama 3's has no lead
grammar, so it is not here. The text: 200 tokens of prose, then a call (the lead grammar only).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from _common import emit, machine, median, pct

PROSE = "The weather in Paris is usually mild in spring, with showers and sunny spells. " * 13
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def per_token_us(g, grammar: str, ids: list[int], reps: int) -> list[float]:
    from ortserve.engine.guidance import Constraint, allocate_masks

    out = []
    for rep in range(reps):
        guide = g.guide(Constraint("grammar", grammar + f"// rep {rep}\n", "tools", 1000))
        mask = allocate_masks(1, g.vocab_size)
        for tok in ids:
            t0 = time.perf_counter()
            guide.compute_mask(mask[0])
            out.append((time.perf_counter() - t0) * 1e6)
            if not guide.matcher.consume_token(tok):
                raise SystemExit(f"the grammar refused token {tok}: {guide.matcher.get_error()}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from tokenizers import Tokenizer
    from vocab_tokenizers import tokenizer_dir

    from ortserve.engine.formats import FORMATS
    from ortserve.engine.guidance import Guidance
    from ortserve.engine.tools import parse_tools

    d = tokenizer_dir("qwen2")
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    eos = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))["eos_token"]
    g = Guidance(d / "tokenizer.json", tok.get_vocab_size(), (tok.token_to_id(eos["content"] if isinstance(eos, dict)
                                                                               else eos),))
    fmt, tools = FORMATS["hermes"], parse_tools([WEATHER])
    lead = fmt.grammar(tools, "auto") or ""
    before = "\n".join(l for l in lead.splitlines() if not l.startswith(("lead:", "first", "LEAD:", "TEXT:")))
    before = before.replace(" hermes lead", " hermes").replace("start: TEXT | lead", "start: TEXT | calls")
    before += f"\nTEXT: /{fmt.prose()}/\n"
    prose_ids = tok.encode(PROSE, add_special_tokens=False).ids[:200]
    call_ids = tok.encode(CALL, add_special_tokens=False).ids
    rows = {}
    for name, grammar, ids in (("prose_or_calls", before, prose_ids), ("prose_then_calls", lead, prose_ids),
                               ("prose_then_calls_with_the_call", lead, prose_ids + call_ids)):
        t = per_token_us(g, grammar, ids, args.reps)
        rows[name] = {"tokens": len(ids), "mask_us_median": round(median(t), 1), "mask_us_p95": round(pct(t, 95), 1)}
    rows["ratio_prose_median"] = round(rows["prose_then_calls"]["mask_us_median"] /
                                       rows["prose_or_calls"]["mask_us_median"], 2)
    emit({"benchmark": "lead_prose", "vocab": "qwen2", "vocab_size": tok.get_vocab_size(), "reps": args.reps,
          "machine": machine(), **rows})


if __name__ == "__main__":
    main()
