"""Results -> results.json, results.md (the ADR's tables plus details) and PNG charts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHARTS = {
    "tokens_per_second_vs_prompt.png": ("decode_tps", "prompt", "Decode tokens/s (batch 1)", "tokens/s"),
    "latency_vs_prompt.png": ("latency", "prompt", "End-to-end latency (batch 1)", "seconds"),
    "throughput_vs_batch.png": ("throughput", "batch", "Throughput vs batch size", "generated tokens/s"),
}


def write_report(results: dict[str, Any], out: Path, command: str = "") -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    if command:
        results["command"] = command
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    paths["json"].write_text(json.dumps(results, indent=1), encoding="utf-8")
    paths["markdown"].write_text(markdown(results), encoding="utf-8")
    for name, (metric, axis, title, unit) in CHARTS.items():
        if chart(results, out / name, metric, axis, title, unit):
            paths[name] = out / name
    return paths


# ---- tables ----------------------------------------------------------------------------------

def ok_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in results["backends"] if r.get("status") == "ok"]


def cell_of(row: dict[str, Any], batch: int, length: int) -> dict[str, Any] | None:
    return next((c for c in row.get("cells", []) if c["batch"] == batch and c["prompt_length"] == length
                 and c.get("stats")), None)


def median(cell: dict[str, Any], metric: str) -> float:
    """A cell's median figure; ``wallclock_tps`` is the ADR's (prompt + generated tokens) / latency."""
    if metric == "wallclock_tps":
        tokens = cell.get("input_tokens", 0) * cell["batch"] + cell.get("output_tokens", 0)
        latency = cell["stats"]["latency"]["median"]
        return float(tokens / latency) if latency else 0.0
    return float(cell["stats"][metric]["median"])


def _num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _mib(b: float | None) -> str:
    return "–" if not b else f"{b / 2**20:,.0f}"


def markdown(results: dict[str, Any]) -> str:
    w, m = results["workload"], results["machine"]
    lines = [f"# ortserve bench: {Path(results['model']).name}", ""]
    if results.get("command"):
        lines += [f"Command: `{results['command']}`", ""]
    lines += [
        (f"Machine: {m['cpu']}, {m['cores']} cores, {m.get('ram_gib') or '?'} GiB RAM, {m['os']}, "
         f"Python {m['python']}. Load average (1/5/15 min) at start {m.get('loadavg_start')}, "
         f"at end {m.get('loadavg_end')}: other processes shared the CPU, so treat small differences as noise."),
        "",
        (f"Workload: prompts of {', '.join(map(str, w['prompt_lengths']))} tokens, {w['gen_tokens']} generated "
         f"tokens per request (greedy, EOS ignored), {w['warmup']} warm-up runs and {w['reps']} measured "
         f"repetitions per cell, batch sizes {', '.join(map(str, w['batch_sizes']))} where the backend batches. "
         f"Started {results['started']}, finished {results.get('finished', '?')}."),
        "",
    ]
    if results.get("dropped_prompt_lengths"):
        lines += [(f"Prompt lengths {results['dropped_prompt_lengths']} do not fit the model's context "
                   f"({results['context_length']} tokens) with the generated tokens and were left out."), ""]
    lines += backends_table(results) + [""]
    rows = ok_rows(results)
    cells = sorted({(c["batch"], c["prompt_length"]) for r in rows for c in r.get("cells", []) if c.get("stats")})
    lines += ["## Decode throughput (tokens/s, median)", "",
              ("Tokens after the first over the time after the first; for a batch, all its sequences. "
               "`engine/x` is the ADR's speed-up: the ortserve engine's figure over backend x's (> 1: the "
               "engine is faster)."), ""]
    lines += figure_table(rows, cells, "decode_tps", 1, higher_is_better=True) + [""]
    lines += ["## End-to-end latency (seconds, median)", "",
              "From submitting the batch to its last token. `x/engine` > 1: the engine is faster.", ""]
    lines += figure_table(rows, cells, "latency", 3, higher_is_better=False) + [""]
    lines += ["## Time to first token (seconds, median)", ""]
    lines += figure_table(rows, cells, "ttft", 3, higher_is_better=False) + [""]
    lines += ["## Throughput (generated tokens/s over end-to-end time, median)", ""]
    lines += figure_table(rows, cells, "throughput", 1, higher_is_better=True) + [""]
    lines += ["## Wall-clock throughput ((prompt + generated tokens) / end-to-end latency)", "",
              "The ADR's \"wall-clock throughput\": it grows with the prompt because prefill is fast.", ""]
    lines += figure_table(rows, cells, "wallclock_tps", 1, higher_is_better=True) + [""]
    lines += ["## Every cell: median / p90 over repetitions", ""] + detail_table(rows) + [""]
    lines += ["Charts: `tokens_per_second_vs_prompt.png`, `latency_vs_prompt.png`, `throughput_vs_batch.png`.", ""]
    return "\n".join(lines)


def backends_table(results: dict[str, Any]) -> list[str]:
    out = ["| Backend | Status | Runtime | Load (s) | Peak RSS (MiB) | Quality | Notes |",
           "|---|---|---|---|---|---|---|"]
    for r in results["backends"]:
        q = r.get("quality") or {}
        quality = (f"ppl {q['perplexity']:.2f} ({q['method']}, {q['tokens']} tokens)" if "perplexity" in q
                   else (f"error: {q['error']}" if q.get("error") else "–"))
        peak = max([c.get("peak_rss") or 0 for c in r.get("cells", [])], default=0)
        notes = ""
        if r.get("status") != "ok":
            notes = f"{r.get('reason', '')}" + (f"; to run it: `{r['fix']}`" if r.get("fix") else "")
        failed = [f"batch {c['batch']} x {c['prompt_length']}: {c['error']}" for c in r.get("cells", [])
                  if c.get("error")]
        if failed:
            notes = "; ".join([notes] + failed if notes else failed)
        info = r.get("info") or {}
        load = _num(r.get("load_seconds"), 1) if r.get("load_seconds") is not None else "–"
        out.append(f"| {r['label']} | {r.get('status')} | {info.get('runtime', '–')} | {load} | "
                   f"{_mib(peak)} | {quality} | {notes.replace('|', '/')} |")
    return out


def figure_table(rows: list[dict[str, Any]], cells: list[tuple[int, int]], metric: str, digits: int,
                 higher_is_better: bool) -> list[str]:
    ref = next((r for r in rows if r["name"] == "engine"), None)
    others = [r for r in rows if r is not ref]
    ratio_head = [f"{'engine/' if higher_is_better else ''}{r['name']}{'' if higher_is_better else '/engine'}"
                  for r in others] if ref else []
    head = ["Batch", "Prompt"] + [r["label"] for r in rows] + ratio_head
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b, n in cells:
        vals = []
        for r in rows:
            c = cell_of(r, b, n)
            vals.append(_num(median(c, metric), digits) if c else "–")
        ratios = []
        if ref:
            rc = cell_of(ref, b, n)
            for r in others:
                c = cell_of(r, b, n)
                if rc and c:
                    x, e = median(c, metric), median(rc, metric)
                    ratio = (e / x if x else None) if higher_is_better else (x / e if e else None)
                    ratios.append(_num(ratio, 2))
                else:
                    ratios.append("–")
        out.append("| " + " | ".join([str(b), str(n)] + vals + ratios) + " |")
    return out


def detail_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [("| Backend | Batch | Prompt | TTFT (s) | Decode tok/s | Latency (s) | Throughput tok/s | "
            "Peak RSS (MiB) | Reps |"), "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for c in r.get("cells", []):
            if not c.get("stats"):
                continue
            s = c["stats"]
            out.append(f"| {r['label']} | {c['batch']} | {c['prompt_length']} | {_mp(s, 'ttft', 3)} | "
                       f"{_mp(s, 'decode_tps', 1)} | {_mp(s, 'latency', 3)} | {_mp(s, 'throughput', 1)} | "
                       f"{_mib(c.get('peak_rss'))} | {len(c['reps'])} |")
    return out


def _mp(stats: dict[str, Any], key: str, digits: int) -> str:
    return f"{_num(stats[key]['median'], digits)} / {_num(stats[key]['p90'], digits)}"


# ---- charts ----------------------------------------------------------------------------------

def chart(results: dict[str, Any], path: Path, metric: str, axis: str, title: str, unit: str) -> bool:
    """One line per backend; False (no file) when no backend has two points on this axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = []
    for r in ok_rows(results):
        pts = []
        for c in r.get("cells", []):
            if not c.get("stats"):
                continue
            if axis == "prompt" and c["batch"] == 1:
                pts.append((c["prompt_length"], c["stats"][metric]["median"], c["stats"][metric]["p90"]))
            elif axis == "batch":
                shortest = min(x["prompt_length"] for x in r["cells"])
                if c["prompt_length"] == shortest:
                    pts.append((c["batch"], c["stats"][metric]["median"], c["stats"][metric]["p90"]))
        if pts:
            series.append((r["label"], sorted(pts)))
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for label, pts in series:
        xs, ys, p90 = zip(*pts)
        ax.plot(xs, ys, marker="o", label=label)
        ax.fill_between(xs, ys, p90, alpha=0.12)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({x for _, pts in series for x, _, _ in pts}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("prompt length (tokens)" if axis == "prompt" else "batch size")
    ax.set_ylabel(unit)
    ax.set_title(f"{title}: {Path(results['model']).name}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
