"""The routing config file (JSON or TOML): load, validate, and say exactly what is wrong.

Shape (docs/router.md has a full example):
    defaultProvider, fallbackChain, cooldownSeconds,
    providers.<name> = {type, models, baseUrl, apiKey, apiKeyEnv, timeout, maxRetries, prices, ...},
    routing.rules = [{condition: {...}, action: {provider, model}, reason}]
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ortserve.errors import OrtServeError
from ortserve.providers import PROVIDER_TYPES
from ortserve.providers.base import ProviderOptions
from ortserve.router.costs import Price
from ortserve.router.rules import Rule

# Names that imply a provider type when `type` is not given.
TYPE_BY_NAME = {"local": "local", "onnx": "local", "ortserve": "local", "anthropic": "anthropic",
                "claude": "anthropic", "openrouter": "openai-compatible", "openai": "openai-compatible"}


class RouterConfigError(OrtServeError):
    status = 500
    type = "server_error"
    code = "router_config"


class _Routing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["rule-based"] = "rule-based"
    rules: list[Rule] = Field(default_factory=list)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    version: str | int = "1"
    default_provider: str = Field("local", alias="defaultProvider")
    fallback_chain: list[str] = Field(default_factory=list, alias="fallbackChain")
    cooldown_seconds: float = Field(30.0, ge=0, alias="cooldownSeconds")
    providers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    routing: _Routing = Field(default_factory=_Routing)


@dataclass
class ProviderSpec:
    name: str
    type: str
    options: ProviderOptions
    prices: dict[str, Price] = field(default_factory=dict)


@dataclass
class RouterConfig:
    default_provider: str = "local"
    fallback_chain: list[str] = field(default_factory=list)
    cooldown_seconds: float = 30.0
    providers: dict[str, ProviderSpec] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)
    source: str | None = None

    @classmethod
    def local_only(cls) -> RouterConfig:
        """No config file: one local provider, no rules, no network."""
        return parse_config({}, source=None)


def load_config(path: Path) -> RouterConfig:
    """Read and validate a routing config; RouterConfigError lists every problem."""
    if not path.is_file():
        raise RouterConfigError(f"routing config {path} does not exist",
                                hint="set ORTSERVE_ROUTER_CONFIG to a JSON or TOML file, or unset it")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RouterConfigError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: "
                                    f"{exc.msg}") from None
    elif path.suffix.lower() == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise RouterConfigError(f"{path}: invalid TOML: {exc}") from None
    else:
        raise RouterConfigError(f"{path}: routing config must end in .json or .toml")
    if not isinstance(data, dict):
        raise RouterConfigError(f"{path}: expected an object at the top level")
    if isinstance(data.get("router"), dict):  # allow a [router] table inside a bigger file
        data = data["router"]
    return parse_config(data, source=str(path))


def parse_config(data: dict[str, Any], source: str | None = None) -> RouterConfig:
    where = source or "routing config"
    problems: list[str] = []
    try:
        top = _File.model_validate(data)
    except ValidationError as exc:
        raise RouterConfigError(_format(where, exc.errors(), prefix="")) from None
    specs: dict[str, ProviderSpec] = {}
    for name, raw in top.providers.items():
        spec = _provider(name, raw, problems)
        if spec is not None:
            specs[name] = spec
    if not any(s.type == "local" for s in specs.values()):
        specs["local"] = ProviderSpec("local", "local", PROVIDER_TYPES["local"].Options.model_validate({}))
    known = set(specs) | set(top.providers) | {"local"}  # a broken entry is reported once, above

    def check(name: str, at: str) -> None:
        if name not in known:
            problems.append(f"{at}: unknown provider {name!r} (configured: {', '.join(sorted(known))})")

    check(top.default_provider, "defaultProvider")
    for i, name in enumerate(top.fallback_chain):
        check(name, f"fallbackChain[{i}]")
    for i, rule in enumerate(top.routing.rules):
        check(rule.action.provider, f"routing.rules[{i}].action.provider")
    if problems:
        raise RouterConfigError(f"{where}:\n  " + "\n  ".join(problems))
    return RouterConfig(default_provider=top.default_provider, fallback_chain=list(top.fallback_chain),
                        cooldown_seconds=top.cooldown_seconds, providers=specs, rules=list(top.routing.rules),
                        source=source)


def _provider(name: str, raw: dict[str, Any], problems: list[str]) -> ProviderSpec | None:
    raw = dict(raw)
    kind = raw.get("type") or TYPE_BY_NAME.get(name.lower())
    if kind not in PROVIDER_TYPES:
        problems.append(f"providers.{name}.type: must be one of {', '.join(PROVIDER_TYPES)}"
                        + (f", got {kind!r}" if kind else " (cannot tell from the name)"))
        return None
    raw["type"] = kind
    prices_raw = raw.pop("prices", {})
    try:
        options = PROVIDER_TYPES[kind].Options.model_validate(raw)
    except ValidationError as exc:
        problems.append(_format(None, exc.errors(), prefix=f"providers.{name}."))
        return None
    prices = {}
    for model, price in (prices_raw or {}).items():
        try:
            prices[model] = Price.model_validate(price)
        except ValidationError as exc:
            problems.append(_format(None, exc.errors(), prefix=f"providers.{name}.prices.{model}."))
    if kind != "local" and not getattr(options, "models", None):
        problems.append(f"providers.{name}.models: give at least a 'default' model")
        return None
    return ProviderSpec(name=name, type=kind, options=options, prices=prices)


def _format(where: str | None, errors: list[Any], prefix: str) -> str:
    lines = []
    for e in errors:
        loc = prefix + ".".join(str(p) for p in e["loc"])
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; docs/router.md lists every key)"
        # never echo values back: a mistyped field may hold a key
        lines.append(f"{loc}: {msg}")
    body = "\n  ".join(lines)
    return f"{where}:\n  {body}" if where else body
