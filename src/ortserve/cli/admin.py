"""`ortserve ps`, `ortserve load MODEL`, `ortserve unload MODEL`: clients of a running
server's admin endpoints (/v1/admin/ps, /load, /unload), like Ollama's ps."""

from __future__ import annotations

import json
from typing import Any

import click
import httpx

from ortserve.cli.common import fail
from ortserve.config import load_settings

MB = 1 << 20


def server_options(fn: Any) -> Any:
    fn = click.option("--json", "as_json", is_flag=True, help="Print JSON")(fn)
    fn = click.option("--api-key", default=None, help="API key of the server (default: ORTSERVE_API_KEY)")(fn)
    return click.option("--url", default=None,
                         help="Server URL (default: http://ORTSERVE_HOST:ORTSERVE_PORT)")(fn)


def call(url: str | None, api_key: str | None, method: str, path: str, body: dict[str, Any] | None = None,
         timeout: float = 600.0) -> dict[str, Any]:
    settings = load_settings()
    base = (url or f"http://{settings.host}:{settings.port}").rstrip("/")
    key = api_key or settings.api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.request(method, base + path, json=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the server at {base}: {exc} (is `ortserve serve` running? --url)")
    try:
        data = r.json()
    except ValueError:
        data = {}
    if r.status_code >= 400:
        err = data.get("error", {}) if isinstance(data, dict) else {}
        fail(f"{r.status_code}: {err.get('message') or r.text.strip()[:300]}")
    return data  # type: ignore[no-any-return]


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0:
        return "forever"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def _adapters(m: dict[str, Any]) -> str:
    """The LoRA adapters a model serves, each with when keep_alive drops it (docs/lora.md)."""
    expires = m.get("adapters_expire_in") or {}
    out = []
    for name in m.get("adapters") or []:
        left = expires.get(name)
        out.append(f"{name} (in {_ago(left)})" if left is not None else name)
    return ", ".join(out) or "-"


@click.command("ps")
@server_options
def ps_command(url: str | None, api_key: str | None, as_json: bool) -> None:
    """Models loaded in a running server: memory, requests served, idle time."""
    data = call(url, api_key, "GET", "/v1/admin/ps")
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    rows = [("MODEL", "KIND", "STATE", "MEMORY", "REQUESTS", "IDLE", "UNLOADS IN", "ADAPTERS")]
    for m in data["models"]:
        name = m["model"] + (" (pinned)" if m["pinned"] else "") + (f" + draft {m['draft']}" if m.get("draft") else "")
        rows.append((name, m["kind"], m["state"], f"{m['memory_bytes'] / MB:.0f} MB", str(m["requests"]),
                     _ago(m["idle_seconds"]), "never" if m["keep_alive"] < 0 else _ago(m["expires_in"]),
                     _adapters(m)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    click.echo(f"memory: {data['used_bytes'] / MB:.0f} of {data['budget_bytes'] / MB:.0f} MB budget")


@click.command("load")
@click.argument("model")
@click.option("--keep-alive", default=None, help="Seconds or a duration (5m); 0 = unload when idle, -1 = never")
@server_options
def load_command(model: str, keep_alive: str | None, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Load MODEL (a store model) into a running server now."""
    body: dict[str, Any] = {"model": model}
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    data = call(url, api_key, "POST", "/v1/admin/load", body)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    m = data["model"]
    click.echo(f"loaded {data['loaded']} ({m['memory_bytes'] / MB:.0f} MB) in {data['seconds']:.1f} s")


@click.command("unload")
@click.argument("model")
@server_options
def unload_command(model: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Unload MODEL from a running server (the pinned start model stays)."""
    data = call(url, api_key, "POST", "/v1/admin/unload", {"model": model})
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"unloaded {data['unloaded']} after {data['requests']} requests")
