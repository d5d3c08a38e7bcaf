"""`ortserve telemetry summary|ship|status`: read and forward the offline telemetry files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from ortserve.config import load_settings
from ortserve.errors import OrtServeError
from ortserve.telemetry.files import SIGNALS, list_files
from ortserve.telemetry.ship import pending, ship
from ortserve.telemetry.summary import format_table, iter_requests, parse_since, summarize

_dir_option = click.option(
    "--telemetry-dir", "telemetry_dir", type=click.Path(path_type=Path), default=None,
    help="Telemetry directory (default: ORTSERVE_TELEMETRY_DIR or HOME/telemetry)")


def _directory(telemetry_dir: Path | None) -> Path:
    return load_settings(telemetry_dir=telemetry_dir).telemetry_path


@click.group("telemetry")
def telemetry_group() -> None:
    """Offline telemetry files: summarise them, or ship them to an OTLP collector.

    The server writes them only with ORTSERVE_TELEMETRY=1 (off by default)."""


@telemetry_group.command("summary")
@click.option("--since", default=None, help="Only requests started since: 30m, 2h, 7d, or an ISO date/time")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table")
@_dir_option
def summary_cmd(since: str | None, as_json: bool, telemetry_dir: Path | None) -> None:
    """Request counts, error rates and latency percentiles by route and model."""
    directory = _directory(telemetry_dir)
    try:
        start = parse_since(since, time.time()) if since else None
    except OrtServeError as exc:
        raise click.BadParameter(exc.message, param_hint="--since") from None
    rows = summarize(iter_requests(directory, start))
    if as_json:
        click.echo(json.dumps({"directory": str(directory), "since": start,
                               "rows": [r.to_dict() for r in rows]}, indent=2))
        return
    when = "" if start is None else " since " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start))
    if not rows:
        click.echo(f"No requests recorded in {directory}{when}. The server writes telemetry only "
                   "with ORTSERVE_TELEMETRY=1.")
        return
    click.echo(f"Requests in {directory}{when}\n")
    click.echo(format_table(rows))


@telemetry_group.command("ship")
@click.option("--endpoint", required=True, help="OTLP/HTTP collector base URL, e.g. http://collector:4318")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds per HTTP request")
@click.option("--header", "headers", multiple=True, metavar="NAME=VALUE",
              help="Extra HTTP header (repeatable), e.g. for collector auth")
@click.option("--gzip", "use_gzip", is_flag=True, help="Compress request bodies (Content-Encoding: gzip)")
@click.option("--dry-run", is_flag=True, help="Only count what would be sent")
@_dir_option
def ship_cmd(endpoint: str, timeout: float, headers: tuple[str, ...], use_gzip: bool, dry_run: bool,
             telemetry_dir: Path | None) -> None:
    """Send every stored record not shipped before to <endpoint>/v1/{traces,metrics,logs}."""
    directory = _directory(telemetry_dir)
    extra = {}
    for h in headers:
        name, sep, value = h.partition("=")
        if not sep:
            raise click.BadParameter(f"{h!r}: expected NAME=VALUE", param_hint="--header")
        extra[name.strip()] = value.strip()
    try:
        if dry_run:
            counts = pending(directory)
            click.echo("Would ship " + ", ".join(f"{counts[s]} {s} lines" for s in SIGNALS)
                       + f" from {directory}")
            return
        result = ship(directory, endpoint, timeout_s=timeout, headers=extra, gzip=use_gzip)
    except OrtServeError as exc:
        raise click.ClickException(exc.one_line()) from None
    except OSError as exc:  # the lock or state file: ship needs write access to the directory
        raise click.ClickException(f"cannot record shipping state in {directory}: {exc}") from None
    if result.total == 0 and not result.corrupt:
        click.echo(f"Nothing new to ship from {directory}.")
        return
    parts = [f"{result.items['traces']} spans", f"{result.items['metrics']} metric points",
             f"{result.items['logs']} log records"]
    click.echo(f"Shipped {', '.join(parts)} ({result.total} lines, {sum(result.posts.values())} "
               f"requests, {result.bytes / 1024:.1f} KiB) to {endpoint}")
    if result.corrupt:
        click.echo(f"Skipped {result.corrupt} unreadable lines.")
    if result.rejected:
        click.echo(f"Warning: the collector reported {result.rejected} items rejected.")


@telemetry_group.command("status")
@_dir_option
def status_cmd(telemetry_dir: Path | None) -> None:
    """Files, sizes and what is still waiting to be shipped."""
    directory = _directory(telemetry_dir)
    files = list_files(directory)
    try:
        counts = pending(directory)
    except OrtServeError as exc:
        raise click.ClickException(exc.one_line()) from None
    click.echo(f"{directory}: {len(files)} files, {sum(f.size for f in files) / 1024 / 1024:.2f} MiB")
    for signal in SIGNALS:
        mine = [f for f in files if f.signal == signal]
        click.echo(f"  {signal:8} {len(mine):4} files {sum(f.size for f in mine) / 1024:10.1f} KiB"
                   f"   {counts[signal]} lines not shipped")
