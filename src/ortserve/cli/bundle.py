"""`ortserve bundle`: an offline install bundle (wheels, models, SHA256SUMS, INSTALL.md)."""

from __future__ import annotations

from pathlib import Path

import click

from ortserve.cli.models import Progress, _emit, _store, handles_errors, json_option


@click.command("bundle")
@click.option("--platform", "platform_", type=click.Choice(["win_amd64", "manylinux", "macos"]),
              default=None, help="Target platform (default: this machine's)")
@click.option("--python", "python_", type=click.Choice(["3.11", "3.12", "3.13"]), default=None,
              help="Target Python (default: this interpreter's)")
@click.option("--device", type=click.Choice(["cpu", "cuda", "dml"]), default="cpu", show_default=True)
@click.option("--models", default="", help="Comma-separated models to include: smollm2-135m or model:variant")
@click.option("--extras", default="", help="More ortserve extras to include, e.g. telemetry")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="New or empty directory")
@click.option("--ortserve-wheel", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Use this ortserve wheel instead of building one from the source tree")
@click.option("--resolve-only", is_flag=True, help="Resolve the wheel set (writes OUT/wheels.json); download nothing")
@json_option
@handles_errors
def bundle_command(platform_: str | None, python_: str | None, device: str, models: str, extras: str,
                   out: Path, ortserve_wheel: Path | None, resolve_only: bool, as_json: bool) -> None:
    """Build an air-gapped install bundle: wheels for the target, models, checksums, INSTALL.md."""
    import sys

    from ortserve.bundle import Target, build_bundle, host_platform

    target = Target(platform=platform_ or host_platform(), python=python_ or f"{sys.version_info[0]}."
                    f"{sys.version_info[1]}", device=device,
                    extras=tuple(e.strip() for e in extras.split(",") if e.strip()))
    refs = [m.strip() for m in models.split(",") if m.strip()]
    with Progress("bundle") as progress:
        summary = build_bundle(target, refs, out, store=_store(), ortserve_wheel=ortserve_wheel,
                               resolve_only=resolve_only, say=progress)
    if as_json:
        return _emit(summary)
    what = "resolved" if resolve_only else "bundled"
    click.echo(f"{what} {len(summary['wheels'])} wheels and {len(summary['models'])} model(s) for "
               f"{target.platform} / Python {target.python} / {target.device} in {out}")
    if not resolve_only:
        click.echo(f"on the target: see {out / 'INSTALL.md'}")
