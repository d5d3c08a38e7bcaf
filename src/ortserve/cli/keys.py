"""`ortserve keys add NAME [--scope user|admin]`, `keys list`, `keys revoke NAME`: the key file
that ORTSERVE_API_KEYS_FILE names (docs/keys.md). A running server re-reads it when it changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ortserve.cli.common import echo_json, fail, guarded
from ortserve.config import load_settings
from ortserve.tenants import SCOPES, USER, add_key, read_keys, revoke_key


def _file(path: str | None) -> Path:
    if path:
        return Path(path).expanduser()
    configured = load_settings().api_keys_file
    if configured is None:
        fail("no key file: set ORTSERVE_API_KEYS_FILE (as the server has it) or pass --file PATH")
    return configured  # type: ignore[return-value]


def file_option(fn: Any) -> Any:
    return click.option("--file", "path", default=None,
                        help="The key file (default: ORTSERVE_API_KEYS_FILE)")(fn)


@click.group("keys")
def keys_group() -> None:
    """API keys, each its own tenant: add (prints the key once), list, revoke."""


@keys_group.command("add")
@click.argument("name")
@click.option("--scope", type=click.Choice(SCOPES), default=USER, show_default=True,
              help="user: infer, own files, vector stores and stored responses; admin: also manage models")
@file_option
@guarded
def add_command(name: str, scope: str, path: str | None) -> None:
    """Make a key for NAME; only its SHA-256 is written, so copy the key now."""
    file = _file(path)
    key = add_key(file, name, scope)
    click.echo(key)
    click.echo(f"added {name} ({scope}) to {file}; this key is not shown again", err=True)


@keys_group.command("list")
@file_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON")
@guarded
def list_command(path: str | None, as_json: bool) -> None:
    """The keys' names and scopes (never the keys)."""
    rows = [{"name": k.name, "scope": k.scope, "sha256": k.digest[:12]} for k in read_keys(_file(path))]
    if as_json:
        echo_json(rows)
        return
    click.echo(f"{'NAME':<24} {'SCOPE':<6} SHA256")
    for r in rows:
        click.echo(f"{r['name']:<24} {r['scope']:<6} {r['sha256']}…")


@keys_group.command("revoke")
@click.argument("name")
@file_option
@guarded
def revoke_command(name: str, path: str | None) -> None:
    """Remove NAME's key; a running server refuses it from its next request (401)."""
    file = _file(path)
    revoke_key(file, name)
    click.echo(f"revoked {name} in {file}")
