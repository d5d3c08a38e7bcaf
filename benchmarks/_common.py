"""Helpers shared by the benchmark scripts (not a library: scripts print JSON)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis briefly.",
    "Give three tips for learning a language.", "What is 12 times 13?", "Describe a rainy afternoon.",
    "Why is the sky blue?", "Name some uses of copper.", "Tell me a short story about a fox.",
    "What does a compiler do?", "How do bees make honey?", "Summarise the plot of Hamlet.",
    "What is a prime number?", "Suggest a name for a bakery.", "How does a bicycle stay upright?",
    "List the planets of the solar system.",
]


def model_dir(arg: str | None) -> tuple[Path, str]:
    from ortserve.config import load_settings
    from ortserve.models.locate import resolve_model_dir

    return resolve_model_dir(arg, load_settings())


def machine() -> dict[str, Any]:
    import psutil

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "ram_gb": round(psutil.virtual_memory().total / 2**30, 1), "loadavg_at_start": load,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return float(s[min(len(s) - 1, round(q * (len(s) - 1)))])


def story_body(model: str, part: int, max_tokens: int) -> dict[str, Any]:
    """A streamed greedy chat that runs exactly ``max_tokens`` tokens (the beside-load benchmarks' text stream)."""
    return {"model": model, "stream": True, "max_tokens": max_tokens, "min_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"Write a long story about a lighthouse, part {part}."}]}


def stream_gaps(url: str, body: dict[str, Any], out: list[float], timeout: float = 900) -> None:
    """POST ``body`` to ``url``/v1/chat/completions as a stream; append the seconds between its data chunks to ``out``."""
    import httpx

    last = None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            if last is not None:
                out.append(now - last)
            last = now


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, indent=2))


def runtime_args(ap: Any, threads: int = 2) -> None:
    """``--threads`` (ONNX Runtime's intra-op threads) and ``--spin`` on an ArgumentParser."""
    ap.add_argument("--threads", type=int, default=threads, help="intra-op threads")
    ap.add_argument("--spin", action="store_true", help="let ONNX Runtime threads spin (off: as the engine runs "
                                                        "on a loaded machine)")


def result_head(benchmark: str, args: Any, **fields: Any) -> dict[str, Any]:
    """The opening fields of a benchmark's JSON: its name, ``fields``, the machine, and the
    ``runtime_args`` it ran with."""
    return {"benchmark": benchmark, **fields, "machine": machine(), "threads": args.threads, "spinning": args.spin}


def emit_with_load(result: dict[str, Any]) -> None:
    """``emit`` with the load average at the end beside the one at the start (``machine()``)."""
    emit({**result, "loadavg_at_end": os.getloadavg()})


class RawOg:
    """onnxruntime-genai's own Generator on the same model: the reference figures."""

    def __init__(self, path: Path, threads: int = 0) -> None:
        import onnxruntime_genai as og

        self.og = og
        cfg = og.Config(str(path))
        if threads:   # the same intra-op thread count as the engine (og's own default: all cores)
            cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        self.model = og.Model(cfg)
        self.tok = og.Tokenizer(self.model)

    def chat_ids(self, question: str) -> list[int]:
        text = self.tok.apply_chat_template(messages=json.dumps([{"role": "user", "content": question}]),
                                            add_generation_prompt=True)
        return list(self.tok.encode(text))

    def single(self, ids: list[int], gen: int) -> dict[str, float]:
        og = self.og
        gp = og.GeneratorParams(self.model)
        gp.set_search_options(max_length=len(ids) + gen, min_length=len(ids) + gen, do_sample=False)
        g = og.Generator(self.model, gp)
        t0 = time.perf_counter()
        g.append_tokens(ids)
        g.generate_next_token()
        t1 = time.perf_counter()
        n = 1
        while not g.is_done() and n < gen:
            g.generate_next_token()
            n += 1
        t2 = time.perf_counter()
        return {"ttft": t1 - t0, "decode_tps": (n - 1) / (t2 - t1), "tokens": n}

    def batch(self, prompts: list[list[int]], gen: int) -> dict[str, float]:
        og = self.og
        import numpy as np

        width = max(len(p) for p in prompts)
        pad = self.tok.pad_token_id if hasattr(self.tok, "pad_token_id") else 0
        arr = np.full((len(prompts), width), pad, dtype=np.int32)
        for i, p in enumerate(prompts):
            arr[i, : len(p)] = p  # og pads on the right (as encode_batch does)
        gp = og.GeneratorParams(self.model)
        gp.set_search_options(max_length=width + gen, min_length=width + gen, batch_size=len(prompts),
                              do_sample=False)
        g = og.Generator(self.model, gp)
        t0 = time.perf_counter()
        g.append_tokens(arr)
        g.generate_next_token()
        t1 = time.perf_counter()
        steps = 1
        while not g.is_done() and steps < gen:
            g.generate_next_token()
            steps += 1
        t2 = time.perf_counter()
        return {"prefill_s": t1 - t0, "decode_tps": len(prompts) * (steps - 1) / (t2 - t1),
                "end_to_end_tps": len(prompts) * steps / (t2 - t0), "steps": steps}




def figure(size: tuple[float, float] = (8, 3.5)) -> tuple[Any, Any]:
    """A matplotlib figure and axes on the file-only backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=size)


def save_figure(fig: Any, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def plot_rss(path: Path, samples: list[tuple[float, float]], warmup_s: float, title: str,
             marks: list[float] = (), series: dict[str, list[tuple[float, float]]] | None = None) -> None:
    """A soak's server RSS over time: ``samples`` (seconds, MB), the warm-up shaded, a dashed line at
    each of ``marks`` (seconds: bursts of disconnects), and other MB series beside it."""
    fig, ax = figure()
    ax.plot([t / 60 for t, _ in samples], [m for _, m in samples], lw=1.5, label="server RSS")
    for label, points in (series or {}).items():
        ax.plot([t / 60 for t, _ in points], [m for _, m in points], lw=1, label=label)
    for t in marks:
        ax.axvline(t / 60, color="tab:red", lw=0.8, ls="--")
    ax.axvspan(0, warmup_s / 60, color="0.9", label="warm-up")
    ax.set_xlabel("minutes")
    ax.set_ylabel("MB")
    ax.set_ylim(0, max(m for _, m in samples) * 1.15)
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    save_figure(fig, path)
