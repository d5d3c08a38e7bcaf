"""Do ortserve's sampling defaults give coherent text on a small model?

30 fixed chat prompts, answered by the served model (default: the store's default variant) with
three settings, each with the same seeds:

- ``ortserve``: the defaults a request with no sampling fields gets (models/sampling.py:
  the model's own, else settings: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), through
  ortserve's sampler (temperature first, then min_p, top_k, top_p: vLLM's order);
- ``openai-bare``: what an OpenAI client that sets nothing used to get (temperature 1, top_p 1);
- ``llama-server``: llama-server's defaults through llama.cpp's sampler chain (top_k 40 -> top_p
  0.95 -> min_p 0.05 on the untempered distribution, temperature 0.8 last), re-implemented
  below and swapped in for the engine's sampler for that run only.

Each answer is scored by the mean per-token negative log-likelihood of its text under the fp32
reference model (lower is more coherent); the fp32 variant is built into the store on first use
(`ortserve models convert MODEL --precision fp32`). NLL alone rewards repetition, so the share of
distinct word trigrams is reported beside it. Prints JSON; ``--markdown`` prints the docs table.

    .venv/bin/python benchmarks/defaults.py --markdown
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import QUESTIONS, emit, machine

PROMPTS = QUESTIONS + [
    "What is the weather usually like in Oslo in winter?", "How do I boil an egg?",
    "Explain what a neural network is to a child.", "Write two sentences about autumn.",
    "What are the three primary colours?", "Why do cats purr?", "Give me a tip for sleeping better.",
    "What is the difference between weather and climate?", "Describe the taste of an orange.",
    "How do airplanes fly?", "What should I pack for a day at the beach?",
    "Explain what recycling is.", "Write a short thank-you note to a teacher.",
    "Why is exercise good for you?",
]
assert len(PROMPTS) == 30


def llama_server_sample(logits: np.ndarray, params: Any, rng: np.random.Generator) -> int:
    """llama.cpp's default chain at llama-server's defaults: top_k 40, top_p 0.95, min_p 0.05 on the
    temperature-1 distribution, then temperature 0.8, then a draw (common/sampling.cpp order)."""
    k = 40
    idx = np.argpartition(logits, logits.size - k)[-k:]
    idx = idx[np.argsort(-logits[idx], kind="stable")]
    x = logits[idx].astype(np.float64)
    p = np.exp(x - x[0])
    p /= p.sum()
    keep = int(np.searchsorted(np.cumsum(p), 0.95, side="left")) + 1    # top_p: the token crossing 0.95 stays
    idx, x = idx[:keep], x[:keep]
    keep = int(np.count_nonzero(x >= x[0] + np.log(0.05)))               # min_p relative to the top token
    idx, x = idx[:keep], x[:keep]
    p = np.exp((x - x[0]) / 0.8)                                         # temperature last
    return int(idx[rng.choice(len(p), p=p / p.sum())])


def fp32_reference(store: Any, model: str) -> Path:
    from ortserve.models.importer import convert_model

    for v in store.find(model):
        if v.precision == "fp32" and v.device == "cpu":
            return v.model_dir
    print(f"building the fp32 reference of {model} (once)", file=sys.stderr)
    return convert_model(store, model, precision="fp32", device="cpu",
                         progress=lambda m: print(f"  {m}", file=sys.stderr)).model_dir


class Scorer:
    """Log-probabilities under the reference model, one ONNX Runtime session for every answer
    (models/quality.token_logprobs opens one per call)."""

    def __init__(self, model_dir: Path) -> None:
        import json

        import onnxruntime as ort

        cfg = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.sess = ort.InferenceSession(str(model_dir / cfg.get("filename", "model.onnx")), so,
                                         providers=["CPUExecutionProvider"])
        self.kv = [i.name for i in self.sess.get_inputs() if i.name.startswith("past_key_values")]
        self.shape = (1, cfg["num_key_value_heads"], 0, cfg["head_size"])

    def nll(self, prompt: list[int], answer: list[int]) -> np.ndarray:
        """Negative log-likelihood of each answer token given the prompt and the answer before it."""
        ids = np.array([prompt + answer], dtype=np.int64)
        feeds: dict[str, Any] = {"input_ids": ids[:, :-1], "attention_mask": np.ones_like(ids[:, :-1])}
        for n in self.kv:
            feeds[n] = np.zeros(self.shape, dtype=np.float32)
        logits = self.sess.run(["logits"], feeds)[0][0].astype(np.float64)[-len(answer):]
        m = logits.max(-1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(logits - m).sum(-1))
        return lse - logits[np.arange(len(answer)), answer]


def distinct3(text: str) -> float:
    words = text.split()
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    return len(set(grams)) / len(grams) if grams else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model to sample from (default: the store's default)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=2, help="answers per prompt and setting")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("ORTSERVE_LOG_LEVEL", "warning")

    from ortserve.config import load_settings
    from ortserve.engine import LLM, LoadedModel
    from ortserve.engine import postprocess as engine_core  # sample() is looked up there
    from ortserve.models.locate import resolve_model_dir
    from ortserve.models.sampling import defaults_for
    from ortserve.models.store import ModelStore
    from ortserve.types import SamplingParams

    settings = load_settings()
    model_dir, model_id = resolve_model_dir(args.model, settings)
    ours = defaults_for(settings, model_dir)
    model_name = model_id.split(":")[0]
    ref_dir = fp32_reference(ModelStore(settings.store_dir), model_name)
    started = machine()
    setups = {
        "ortserve": (dict(ours.values), engine_core.sample),
        "openai-bare": ({"temperature": 1.0, "top_p": 1.0}, engine_core.sample),
        "llama-server": ({"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}, llama_server_sample),
    }
    messages = [[{"role": "user", "content": q}] for q in PROMPTS]
    answers: dict[str, list[tuple[int, str]]] = {name: [] for name in setups}
    original = engine_core.sample
    t0 = time.perf_counter()
    with LLM(LoadedModel(model_dir, settings, model_id), settings) as llm:
        codec = llm.engine.codec
        prompt_ids = [codec.encode(codec.render_chat(m), add_special_tokens=False) for m in messages]
        for seed in range(args.seeds):
            for name, (values, sampler) in setups.items():   # settings alternate seed by seed
                engine_core.sample = sampler
                try:
                    outs = llm.generate(messages, SamplingParams(**values, max_tokens=args.max_tokens,
                                                                 seed=1000 + seed), progress=False)
                finally:
                    engine_core.sample = original
                answers[name] += [(i, o.text) for i, o in enumerate(outs)]
    gen_s = time.perf_counter() - t0
    scorer = Scorer(Path(ref_dir))
    results: dict[str, Any] = {}
    for name, items in answers.items():
        per_answer, all_nll = [], []
        for i, text in items:
            ids = codec.encode(text, add_special_tokens=False)
            if not ids:
                continue
            nll = scorer.nll(prompt_ids[i], ids)
            per_answer.append(float(nll.mean()))
            all_nll.extend(nll.tolist())
        results[name] = {
            "sampling": setups[name][0] if name != "llama-server" else {**setups[name][0], "order": "llama.cpp"},
            "mean_token_nll": round(float(np.mean(all_nll)), 4),
            "stderr": round(float(np.std(all_nll) / np.sqrt(len(all_nll))), 4),
            "mean_answer_nll": round(float(np.mean(per_answer)), 4),
            "tokens": len(all_nll), "answers": len(items),
            "distinct_3grams": round(float(np.mean([distinct3(t) for _, t in items])), 3),
            "example": items[PROMPTS.index("What is the weather usually like in Oslo in winter?")][1][:160],
        }
    base = results["ortserve"]["mean_token_nll"]
    report = {
        "benchmark": "sampling defaults: mean per-token NLL under the fp32 reference (lower = more coherent)",
        "model": model_id, "reference": str(ref_dir), "prompts": len(PROMPTS), "seeds": args.seeds,
        "max_tokens": args.max_tokens, "ortserve_defaults_from": dict(ours.sources),
        "machine": started, "loadavg_at_end": os.getloadavg(), "generation_seconds": round(gen_s, 1),
        "results": results,
        "ratios": {"ortserve_vs_openai_bare": round(base / results["openai-bare"]["mean_token_nll"], 3),
                   "ortserve_vs_llama_server": round(base / results["llama-server"]["mean_token_nll"], 3)},
    }
    if args.markdown:
        print("| setting | sampling | mean token NLL (± s.e.) | mean answer NLL | distinct 3-grams | tokens |")
        print("|---|---|---:|---:|---:|---:|")
        for name, r in results.items():
            s = ", ".join(f"{k}={v}" for k, v in r["sampling"].items())
            print(f"| {name} | {s} | {r['mean_token_nll']:.3f} ± {r['stderr']:.3f} | "
                  f"{r['mean_answer_nll']:.3f} | {r['distinct_3grams']:.3f} | {r['tokens']} |")
        print()
    emit(report)


if __name__ == "__main__":
    main()
