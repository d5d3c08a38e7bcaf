"""`ortserve`: one command per user verb. The CLI is a client of the same engine and API."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from typing import Any

import click

from ortserve import __version__
from ortserve.cli.common import (
    fail,
    guarded,
    model_options,
    pop_model_flags,
    progress_printer,
    settings_from,
)
from ortserve.cli.system import config_command, info
from ortserve.cli.talk import ask, chat


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ortserve")
def cli() -> None:
    """ortserve: run language models on your own machine, offline, on ONNX Runtime."""


@cli.command()
@model_options
@click.option("--host", default=None, help="Address to bind (default 127.0.0.1)")
@click.option("--port", type=int, default=None, help="Port to bind (default 8002)")
@click.option("--api-key", default=None, help="Require Authorization: Bearer KEY on every route but /healthz")
@click.option("--cors-origins", default=None, help="Comma-separated allowed CORS origins")
@click.option("--max-queue", type=int, default=None, help="Waiting requests beyond this get 429")
@click.option("--max-body-bytes", type=int, default=None, help="Bodies larger than this get 413")
@click.option("--max-tokens-cap", type=int, default=None, help="Largest max_tokens a request may ask")
@click.option("--default-max-tokens", type=int, default=None, help="max_tokens when a request gives none")
@click.option("--keep-alive", type=float, default=None,
              help="Seconds an idle on-demand model stays loaded (0 = unload after each request, -1 = never)")
@click.option("--memory-budget-mb", type=int, default=None, help="Memory for all loaded models (0 = 80% of RAM)")
@click.option("--load-wait", type=float, default=None, help="Seconds a request waits for a model load before 503")
@click.option("--draft-model", default=None,
              help="A store model of the same vocabulary that guesses tokens for the served one (speculation)")
@click.option("--image-dir", default=None,
              help="Folder whose images requests may name as file:// URLs (docs/vision.md); unset = refused")
@click.option("--router-config", default=None, help="Routing config file (JSON/TOML)")
@click.option("--telemetry/--no-telemetry", default=None, help="Write OpenTelemetry files")
@click.option("--telemetry-dir", default=None, help="Directory for telemetry files (implies --telemetry)")
@click.option("--log-level", default=None, help="debug, info, warning, error")
@guarded
def serve(**kwargs: Any) -> None:
    """Serve a model over HTTP (the seed's API and an OpenAI-compatible API)."""
    if kwargs.get("telemetry_dir") and kwargs.get("telemetry") is None:
        kwargs["telemetry"] = True  # a telemetry directory only means something with telemetry on
    elif kwargs.get("telemetry_dir") and kwargs.get("telemetry") is False:
        click.echo("ortserve: --telemetry-dir has no effect with --no-telemetry; nothing is written", err=True)
    flags = pop_model_flags(kwargs)
    settings = settings_from(**flags, **kwargs)
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if settings.image_dir is not None and not settings.image_dir.expanduser().is_dir():   # say so now, not per image
        fail(f"the image folder (--image-dir / ORTSERVE_IMAGE_DIR) {settings.image_dir} is not a directory")
    from ortserve.models.locate import resolve_model_dir
    from ortserve.server.run import serve as run

    model_dir, model_id = resolve_model_dir(settings.model, settings, progress_printer())
    from ortserve.server.vision_pinned import is_vision_dir

    if settings.draft_model and is_vision_dir(model_dir):   # never a setting taken and ignored
        fail(f"--draft-model / ORTSERVE_DRAFT_MODEL: {model_id} is a vision model, and speculation is off on its "
             "image and text rows (docs/vision.md); start it without a draft model")
    if settings.draft_model:  # a wrong id or another vocabulary: say so now, not in /healthz
        from ortserve.engine.speculation.draft import check_vocabulary
        from ortserve.server.engine_loader import draft_of

        draft_dir, draft_id = draft_of(settings)  # type: ignore[misc]
        check_vocabulary(model_dir, model_id, draft_dir, draft_id)
    click.echo(f"ortserve {__version__}: serving {model_id} from {model_dir} on "
               f"http://{settings.host}:{settings.port}", err=True)
    run(settings, model_dir, model_id)


cli.add_command(ask)
cli.add_command(chat)
cli.add_command(info)
cli.add_command(config_command)

# Command groups that live in their own modules (models, route/costs, telemetry, bench).
_PLUGINS = [("ortserve.cli.models", "models_group"), ("ortserve.cli.route", "route_group"),
            ("ortserve.cli.route", "costs_command"), ("ortserve.cli.telemetry", "telemetry_group"),
            ("ortserve.cli.bench", "bench_command"), ("ortserve.cli.transcribe", "transcribe_command"),
            ("ortserve.cli.admin", "ps_command"),
            ("ortserve.cli.admin", "load_command"), ("ortserve.cli.admin", "unload_command"),
            ("ortserve.cli.deploy", "deploy_group"), ("ortserve.cli.rag", "rag_group"),
            ("ortserve.cli.bundle", "bundle_command"), ("ortserve.cli.keys", "keys_group")]
for _module, _attr in _PLUGINS:
    if importlib.util.find_spec(_module) is not None:
        cli.add_command(getattr(importlib.import_module(_module), _attr))


def main() -> None:
    cli(prog_name="ortserve")


if __name__ == "__main__":
    sys.exit(main())
