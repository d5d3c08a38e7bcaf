"""The plumbing the model commands share (and `ortserve bundle` uses): typed errors to one line
and an exit code, the store, JSON output, a progress line, tables, the quality warning and
the builder's quantization flags.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ortserve.errors import OrtServeError

F = TypeVar("F", bound=Callable[..., Any])
QUALITY_WARN_PCT = 5.0
PRECISIONS = ("fp32", "fp16", "int8", "int4")
DEVICES = ("cpu", "cuda", "dml", "webgpu")


def _fail(e: OrtServeError) -> None:
    click.echo(f"error: {e.one_line()}", err=True)
    sys.exit(2 if 400 <= e.status < 500 else 1)


def handles_errors(fn: F) -> F:
    """Typed errors become one line on stderr and an exit code; no tracebacks for user mistakes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OrtServeError as e:
            _fail(e)
        except OSError as e:  # permissions, a read-only or full disk outside a build
            click.echo(f"error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""), err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("error: interrupted (nothing was installed)", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def _store() -> Any:
    from ortserve.cli.common import settings_from
    from ortserve.models.store import ModelStore

    return ModelStore(settings_from().store_dir)


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


class Progress:
    """A tqdm status line on a terminal, silence otherwise (pipes, CI, --json consumers)."""

    def __init__(self, title: str) -> None:
        self.bar = None
        if sys.stderr.isatty():
            import shutil

            from tqdm import tqdm

            size = shutil.get_terminal_size((80, 20))  # a 0x0 pty (some CI, `script`) hides the bar
            self.bar = tqdm(total=None, desc=title, file=sys.stderr, leave=False, ncols=size.columns,
                            nrows=size.lines,
                            bar_format="{desc} [{elapsed}]")
        else:  # quiet: also the bars of transformers and the builder (tqdm reads TQDM_DISABLE)
            os.environ.setdefault("TQDM_DISABLE", "1")

    def __call__(self, message: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(message)
            self.bar.update(1)

    def __enter__(self) -> Progress:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _fmt_mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _quality(v: Any) -> str:
    q = v.quality
    if getattr(v, "kind", "chat") == "reranker":
        d = q.get("max_abs_diff")
        return f"max diff {d:.1e}" if d is not None else "-"
    if getattr(v, "kind", "chat") == "embedding":
        c = q.get("cosine_min")
        return f"cosine {q['cosine_mean']:.4f} (min {c:.4f})" if c is not None else "-"
    if q.get("perplexity") is None:
        return "-"
    d = q.get("delta_pct")
    return f"{q['perplexity']:.2f}" + (f" ({d:+.2f}%)" if d is not None else "")


def _speed(v: Any) -> str:
    t = v.speed.get("decode_tps") or v.speed.get("sentences_per_s") or v.speed.get("pairs_per_s")
    return f"{t:g}" if t else "-"


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


def _warn_quality(v: Any) -> None:
    d = v.quality.get("delta_pct")
    if isinstance(d, (int, float)) and d > QUALITY_WARN_PCT:
        click.secho(f"WARNING: {v.id} perplexity is {d:+.1f}% vs fp32 ({v.quality['perplexity']:.2f} vs "
                    f"{v.quality['reference_perplexity']:.2f}), beyond the {QUALITY_WARN_PCT:g}% budget: "
                    "expect visibly worse answers; try int8, or int4 with --algo k_quant --last-matmul int8",
                    err=True, fg="red", bold=True)


def _report_install(v: Any, as_json: bool) -> None:
    _warn_quality(v)
    if as_json:
        _emit(v.to_json())
    else:
        click.echo(f"installed {v.id}  {_fmt_mb(v.size_bytes)}  perplexity {_quality(v)}  "
                   f"decode {_speed(v)} tok/s")


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def quant_options_decorator(fn: F) -> F:
    opts = [
        click.option("--precision", type=click.Choice(PRECISIONS), default=None,
                     help="Weight precision (default: int8 on cpu)."),
        click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
                     help="Execution provider the variant is built for."),
        click.option("--block-size", type=click.Choice(["16", "32", "64", "128", "256"]), default=None,
                     help="Quantization block size (builder default 32)."),
        click.option("--algo", type=click.Choice(["default", "rtn", "k_quant"]), default=None,
                     help="Quantization algorithm."),
        click.option("--last-matmul", type=click.Choice(["int8", "int4"]), default=None,
                     help="Quantize the last MatMul (LM head) to this type (mixed precision)."),
        click.option("--accuracy-level", type=click.IntRange(0, 4), default=None,
                     help="MatMulNBits compute accuracy (4 = int8 activations; CPU default)."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _options(block_size: str | None, algo: str | None, last_matmul: str | None,
             accuracy_level: int | None) -> dict[str, Any]:
    from ortserve.models.importer import quant_options

    return quant_options(int(block_size) if block_size else None, algo, last_matmul, accuracy_level)


def show_reranker(variants: list[Any], as_json: bool) -> None:
    """`models show` of a cross-encoder (docs/rerank.md)."""
    if as_json:
        return _emit({"variants": [v.to_json() for v in variants], "selection": {"cpu": {"id": variants[0].id}}})
    for v in variants:
        cfg = v.notes.get("reranker", {})
        click.echo(f"{v.id}")
        click.echo(f"  kind          reranker (cross-encoder)  max {cfg.get('max_length')} tokens per pair, "
                   f"{cfg.get('activation')} on the logit")
        click.echo(f"  path          {v.model_dir}")
        click.echo(f"  source        {v.source}")
        click.echo(f"  architecture  {v.architecture}")
        click.echo(f"  size          {_fmt_mb(v.size_bytes)} in {len(v.files)} files")
        click.echo(f"  quality       {_quality(v)} vs PyTorch on {v.quality.get('pairs', 0)} pairs")
        click.echo(f"  speed         {_speed(v)} pairs/s (CPU)")
        click.echo(f"  use it as     POST /v1/rerank {{\"model\": \"{v.model}\", ...}}")
    return None


def show_embedding(variants: list[Any], as_json: bool) -> None:
    from ortserve.models.embed_import import choose_embedding

    chosen = choose_embedding(variants)
    if as_json:
        return _emit({"variants": [v.to_json() for v in variants], "selection": {"cpu": {"id": chosen.id}}})
    for v in variants:
        cfg = v.notes.get("embedding", {})
        click.echo(f"{v.id}")
        click.echo(f"  kind          embedding  {cfg.get('dimensions')} dims, {cfg.get('pooling')} pooling"
                   + (", normalised" if cfg.get("normalize") else ""))
        click.echo(f"  path          {v.model_dir}")
        click.echo(f"  source        {v.source}")
        click.echo(f"  architecture  {v.architecture}  max tokens {v.context_length}")
        click.echo(f"  precision     {v.precision} for {v.device}")
        click.echo(f"  size          {_fmt_mb(v.size_bytes)} in {len(v.files)} files")
        click.echo(f"  quality       {_quality(v)} vs PyTorch on {v.quality.get('sentences', 0)} sentences")
        click.echo(f"  speed         {_speed(v)} sentences/s (CPU)")
    click.echo(f"on cpu: {chosen.id} - fastest variant with worst cosine >= 0.99 vs PyTorch")
