"""Shared CLI pieces: settings from flags, one-line errors, progress on terminals only."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from ortserve.config import Settings, load_settings
from ortserve.errors import OrtServeError


def fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Report user-facing errors as one line on stderr with exit code 1; no tracebacks."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OrtServeError as exc:
            fail(exc.one_line())
        except (ValueError, OSError) as exc:
            text = str(exc).strip().splitlines()
            fail(text[0] if text else type(exc).__name__)

    return wrapper


def settings_from(**flags: Any) -> Settings:
    try:
        return load_settings(**flags)
    except ValueError as exc:  # pydantic ValidationError is a ValueError
        errors = getattr(exc, "errors", list)()
        if errors:
            e = errors[0]
            fail(f"invalid setting {'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}")
        fail(str(exc))
    raise AssertionError  # unreachable


def model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--model and the runtime options every model-using command takes."""
    opts = [
        click.option("--model", "-m", default=None,
                     help="Model id in the store, a model directory, or a .gguf file (imported on first use)"),
        click.option("--device", default=None, help="auto, cpu, cuda, dml, webgpu, openvino"),
        click.option("--max-batch", type=int, default=None, help="Most sequences decoded together"),
        click.option("--max-length", type=int, default=None, help="Cap on context length"),
        click.option("--intra-op-threads", type=int, default=None, help="ONNX Runtime intra-op threads"),
        click.option("--inter-op-threads", type=int, default=None, help="ONNX Runtime inter-op threads"),
        click.option("--thread-spinning/--no-thread-spinning", default=None,
                     help="ONNX Runtime threads spin while waiting (faster when the cores are idle)"),
        click.option("--graph-optimization-level", type=click.Choice(["disable", "basic", "extended", "all"]),
                     default=None, help="ONNX Runtime graph optimization level"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


MODEL_FLAGS = ("model", "device", "max_batch", "max_length", "intra_op_threads", "inter_op_threads",
               "graph_optimization_level", "thread_spinning")


def pop_model_flags(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs.pop(k) for k in MODEL_FLAGS if k in kwargs}


def progress_printer() -> Callable[[str], None] | None:
    """Status lines for long work on a terminal; nothing when output is piped."""
    if not sys.stderr.isatty():
        return None
    return lambda msg: click.echo(f"  {msg}", err=True)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def load_model(settings: Settings) -> Any:
    from ortserve.engine import LoadedModel
    from ortserve.models.locate import resolve_model_dir
    from ortserve.server.engine_loader import draft_of

    model_dir, model_id = resolve_model_dir(settings.model, settings, progress_printer())
    return LoadedModel(model_dir, settings, model_id, draft=draft_of(settings))  # ORTSERVE_DRAFT_MODEL
