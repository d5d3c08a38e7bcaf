"""What each family's tool syntax costs the grammar, on its real tokenizer: compile time and the
mask time per generated token, against Hermes' grammar on the same vocabulary in the same run
(ratio > 1: slower than Hermes). Random logits under the mask stand for the model (no weights).

    python benchmarks/tool_formats.py [--reps 5]

Vocabularies are llama.cpp's vocab GGUFs (tests/llamacpp.py), turned into tokenizer.json once
and cached (tests/vocab_tokenizers.py). Five tools with bounded arguments, tool_choice required, parallel calls on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from _common import emit, machine, median

# five tools whose arguments are bounded (strings ≤ 16 characters, small integers), so random logits
# finish a call list well inside the 300-token budget
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {
    "type": "object", "properties": props, "required": list(props)}}}
    for name, props in [
        ("get_weather", {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}}),
        ("search_web", {"query": {"type": "string", "maxLength": 16}, "top_k": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 9}}),
        ("send_email", {"to": {"type": "string", "maxLength": 16}, "subject": {"type": "string", "maxLength": 16}}),
        ("get_time", {"tz": {"type": "string", "maxLength": 16}}),
        ("add", {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                 "b": {"type": "integer", "minimum": 0, "maximum": 99}})]]
PAIRS = [("llama3_json", "llama-bpe"), ("hermes", "qwen2"), ("phi4", "phi-3"), ("gemma", "gemma-4"),
         ("mistral", "llama-spm")]


def run(reps: int) -> dict[str, object]:
    import numpy as np
    from vocab_tokenizers import tokenizer_dir

    from ortserve.engine.formats import FORMATS
    from ortserve.engine.guidance import Constraint, Guidance, allocate_masks, apply_mask
    from ortserve.engine.tools import parse_tools

    tools = parse_tools(TOOLS)
    rows = []
    for fmt_name, vocab in PAIRS:
        import json

        from tokenizers import Tokenizer

        d = tokenizer_dir(vocab)
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        eos = json.loads((d / "tokenizer_config.json").read_text())["eos_token"]
        eos = eos["content"] if isinstance(eos, dict) else eos
        g = Guidance(d / "tokenizer.json", tok.get_vocab_size(), (tok.token_to_id(eos),))
        _ = g.vocab  # built once per model, not part of a request
        side: dict[str, dict[str, list[float]]] = {}
        for name in dict.fromkeys((fmt_name, "hermes")):
            grammar = FORMATS[name].grammar(tools, "required") or ""
            compile_s, mask_ms, tokens = [], [], []
            for rep in range(reps):
                c = Constraint("grammar", grammar + f"// {name} rep {rep}\n", "tools", 300)  # a cold compile each rep
                t0 = time.perf_counter()
                guide = g.guide(c)
                compile_s.append(time.perf_counter() - t0)
                rng, mask, n, spent = np.random.default_rng(rep), allocate_masks(1, g.vocab_size), 0, 0.0
                while not guide.stopped and n < 300:
                    t0 = time.perf_counter()
                    guide.compute_mask(mask[0])
                    spent += time.perf_counter() - t0
                    logits = rng.standard_normal(g.vocab_size).astype(np.float32)
                    apply_mask(logits, mask[0])
                    token = int(np.argmax(logits))
                    guide.consume(token)
                    n += 1
                    if token in g.eos_ids:
                        break
                mask_ms.append(1000 * spent / max(n, 1))
                tokens.append(n)
            side[name] = {"compile_s": compile_s, "mask_ms": mask_ms, "tokens": tokens}
        f, h = side[fmt_name], side["hermes"]  # the same run for Hermes' own row (ratio 1)
        rows.append({"format": fmt_name, "vocab": vocab, "vocab_size": g.vocab_size,
                     "compile_ms": round(1000 * median(f["compile_s"]), 1),
                     "hermes_compile_ms": round(1000 * median(h["compile_s"]), 1),
                     "mask_ms_per_token": round(median(f["mask_ms"]), 3),
                     "hermes_mask_ms_per_token": round(median(h["mask_ms"]), 3),
                     "mask_ratio_vs_hermes": round(median(f["mask_ms"]) / max(median(h["mask_ms"]), 1e-9), 2),
                     "tokens_per_answer": median([float(x) for x in f["tokens"]])})
    return {"benchmark": "tool_formats", "reps": reps, "machine": machine(), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    emit(run(ap.parse_args().reps))


if __name__ == "__main__":
    main()
