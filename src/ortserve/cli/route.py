"""`ortserve route explain|check` and `ortserve costs`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ortserve.config import load_settings
from ortserve.errors import OrtServeError
from ortserve.providers.base import ChatRequest, Hints
from ortserve.router.costs import CostReport, Ledger, parse_since
from ortserve.router.router import Router

LEVELS = click.Choice(["low", "medium", "high"], case_sensitive=False)


def _router(config: Path | None) -> Router:
    settings = load_settings(router_config=config)
    try:
        return Router.from_settings(settings)
    except OrtServeError as exc:
        raise click.ClickException(exc.one_line()) from None


@click.group("route")
def route_group() -> None:
    """See which provider would answer a request, and check the routing config."""


@route_group.command("explain")
@click.argument("prompt")
@click.option("--privacy", type=LEVELS, help="Privacy hint; high never leaves this machine.")
@click.option("--local-only", is_flag=True, help="Same guarantee as --privacy high.")
@click.option("--complexity", type=LEVELS, help="Complexity hint (default: estimated from the prompt).")
@click.option("--agent-type", help="Agent type hint, e.g. researcher, coder.")
@click.option("--provider", help="Pin a provider, as `ortserve ask --provider` does.")
@click.option("--config", "config", type=click.Path(path_type=Path),
              help="Routing config file (default: ORTSERVE_ROUTER_CONFIG; none = local only).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def explain(prompt: str, privacy: str | None, local_only: bool, complexity: str | None,
            agent_type: str | None, provider: str | None, config: Path | None, as_json: bool) -> None:
    """Which provider would answer PROMPT and why. Makes no network call."""
    router = _router(config)
    hints = Hints(privacy=privacy, local_only=local_only, complexity=complexity,  # type: ignore[arg-type]
                  agent_type=agent_type)
    request = ChatRequest(messages=[{"role": "user", "content": prompt}], hints=hints, provider=provider)
    try:
        d = router.decide(request).to_dict()
    except OrtServeError as exc:
        raise click.ClickException(exc.one_line()) from None
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    est = " (estimated)" if d["complexity_estimated"] else ""
    rows = [("provider", d["provider"]), ("model", d["model"]), ("reason", d["reason"]),
            ("chain", " -> ".join(d["chain"])), ("complexity", f"{d['complexity']}{est}"),
            ("prompt", f"~{d['prompt_tokens']} tokens"), ("private", "yes" if d["private"] else "no")]
    rows += [("note", n) for n in d["notes"]]
    for k, v in rows:
        click.echo(f"{k + ':':<12}{v}")


@route_group.command("check")
@click.option("--config", "config", type=click.Path(path_type=Path),
              help="Routing config file (default: ORTSERVE_ROUTER_CONFIG).")
def check(config: Path | None) -> None:
    """Validate the routing config and show each provider's state (keys are never shown)."""
    router = _router(config)
    c = router.config
    click.echo(f"config:   {c.source or '(none: everything runs locally)'}")
    click.echo(f"default:  {c.default_provider}")
    click.echo(f"fallback: {' -> '.join(c.fallback_chain) or '(none)'}")
    click.echo(f"rules:    {len(c.rules)}")
    for name, p in router.providers.items():
        where = "local" if p.capabilities.local else "cloud"
        state = "ready" if p.ready else f"not ready: {p.not_ready_reason}"
        click.echo(f"  {name:<12} {where:<6} {p.default_model():<32} {state}")


@click.command("costs")
@click.option("--since", help="Only requests since: 24h, 7d, 30m, 2w or a date like 2026-11-01.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--ledger", type=click.Path(path_type=Path), help="Ledger file (default: HOME/costs.sqlite).")
def costs_command(since: str | None, as_json: bool, ledger: Path | None) -> None:
    """Totals by provider and model, and the savings against the default cloud model."""
    try:
        start = parse_since(since) if since else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    report = Ledger(ledger or load_settings().ledger_path).report(start)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    click.echo(render_report(report))


def render_report(r: CostReport) -> str:
    head = f"Costs since {r.since}" if r.since else "Costs (all time)"
    lines = [f"{head} - ledger {r.ledger}"]
    if not r.rows:
        return lines[0] + "\nno requests recorded"
    table: list[tuple[Any, ...]] = [("provider", "model", "requests", "tokens in", "tokens out", "cost USD")]
    for row in r.rows:
        cost = f"{row.cost_usd:.6f}" + (f" (+{row.unpriced} unpriced)" if row.unpriced else "")
        table.append((row.provider, row.model, row.requests, f"{row.prompt_tokens:,}",
                      f"{row.completion_tokens:,}", cost))
    table.append(("total", "", r.requests, f"{sum(x.prompt_tokens for x in r.rows):,}",
                  f"{sum(x.completion_tokens for x in r.rows):,}", f"{r.cost_usd:.6f}"))
    widths = [max(len(str(t[i])) for t in table) for i in range(6)]
    for t in table:
        cells = [str(v).ljust(w) if i < 2 else str(v).rjust(w) for i, (v, w) in enumerate(zip(t, widths))]
        lines.append("  ".join(cells).rstrip())
    if r.baseline_usd is not None and r.savings_usd is not None:
        pct = f" ({100 * r.savings_usd / r.baseline_usd:.0f}%)" if r.baseline_usd > 0 else ""
        lines.append(f"All on {', '.join(r.baseline_models)}: {r.baseline_usd:.6f} USD; "
                     f"saved {r.savings_usd:.6f} USD{pct}")
    else:
        lines.append("No cloud model configured: no savings baseline")
    return "\n".join(lines)
