"""The routing config: the seed's shape in JSON and TOML, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortserve.router.config import RouterConfig, RouterConfigError, load_config, parse_config

SEED = {
    "version": "1.0",
    "defaultProvider": "anthropic",
    "fallbackChain": ["anthropic", "openrouter", "onnx"],
    "providers": {
        "anthropic": {"models": {"default": "claude-sonnet-4-5", "fast": "claude-haiku-4-5"}},
        "openrouter": {"models": {"default": "openai/gpt-4o-mini"}, "timeout": 30},
        "onnx": {"models": {"default": "smollm2-135m"}},
    },
    "routing": {"mode": "rule-based", "rules": [
        {"condition": {"privacy": "high", "localOnly": True},
         "action": {"provider": "onnx", "model": "smollm2-135m"},
         "reason": "Privacy-sensitive tasks use local ONNX models"},
        {"condition": {"agentType": ["researcher"], "complexity": "low"},
         "action": {"provider": "onnx"}, "reason": "Simple tasks use free local inference"},
        {"condition": {"complexity": "high", "maxPromptTokens": 100000},
         "action": {"provider": "anthropic", "model": "default"}},
    ]},
}

SEED_TOML = """
defaultProvider = "anthropic"
fallbackChain = ["anthropic", "openrouter", "onnx"]

[providers.anthropic.models]
default = "claude-sonnet-4-5"
fast = "claude-haiku-4-5"

[providers.openrouter]
timeout = 30
models = { default = "openai/gpt-4o-mini" }

[providers.onnx.models]
default = "smollm2-135m"

[[routing.rules]]
condition = { privacy = "high", localOnly = true }
action = { provider = "onnx", model = "smollm2-135m" }
reason = "Privacy-sensitive tasks use local ONNX models"

[[routing.rules]]
condition = { agentType = ["researcher"], complexity = "low" }
action = { provider = "onnx" }
reason = "Simple tasks use free local inference"

[[routing.rules]]
condition = { complexity = "high", maxPromptTokens = 100000 }
action = { provider = "anthropic", model = "default" }
"""


def _summary(c: RouterConfig) -> tuple:
    return (c.default_provider, c.fallback_chain, {n: s.type for n, s in c.providers.items()},
            [r.model_dump() for r in c.rules])


def test_seed_shape_loads_from_json_and_toml_identically(tmp_path: Path) -> None:
    j = tmp_path / "route.json"
    j.write_text(json.dumps(SEED), encoding="utf-8")
    t = tmp_path / "route.toml"
    t.write_text(SEED_TOML, encoding="utf-8")
    cj, ct = load_config(j), load_config(t)
    assert _summary(cj) == _summary(ct)
    assert {n: s.type for n, s in cj.providers.items()} == {
        "anthropic": "anthropic", "openrouter": "openai-compatible", "onnx": "local"}
    assert cj.rules[0].condition.privacy == ["high"] and cj.rules[0].condition.local_only is True
    assert cj.rules[1].condition.agent_type == ["researcher"]
    assert cj.providers["openrouter"].options.timeout == 30
    assert "local" not in cj.providers  # onnx is the local provider; no second one is invented


def test_no_config_means_one_local_provider() -> None:
    c = RouterConfig.local_only()
    assert list(c.providers) == ["local"] and c.default_provider == "local"
    assert c.fallback_chain == [] and c.rules == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["providers"]["anthropic"].update(timout=5),
     "providers.anthropic.timout: unknown key"),
    (lambda d: d["providers"]["openrouter"].update(timeout=-1),
     "providers.openrouter.timeout: Input should be greater than 0"),
    (lambda d: d["fallbackChain"].append("gemini"),
     "fallbackChain[3]: unknown provider 'gemini'"),
    (lambda d: d["routing"]["rules"][0]["action"].update(provider="nope"),
     "routing.rules[0].action.provider: unknown provider 'nope'"),
    (lambda d: d["routing"]["rules"][1]["condition"].update(complexity="extreme"),
     "routing.rules.1.condition.complexity.0"),
    (lambda d: d["routing"]["rules"][1]["condition"].update(colour="red"),
     "routing.rules.1.condition.colour: unknown key"),
    (lambda d: d["providers"].update(mystery={"models": {"default": "x"}}),
     "providers.mystery.type: must be one of local, anthropic, openai-compatible"),
    (lambda d: d["providers"]["anthropic"].update(models={}),
     "providers.anthropic.models: give at least a 'default' model"),
    (lambda d: d["providers"]["anthropic"].update(baseUrl="api.anthropic.com"),
     "providers.anthropic.baseUrl: Value error, must start with http:// or https://"),
    (lambda d: d["providers"]["anthropic"].update(prices={"claude-sonnet-4-5": {"input": 3}}),
     "providers.anthropic.prices.claude-sonnet-4-5.output: Field required"),
    (lambda d: d.update(defaultProvider="gpt"), "defaultProvider: unknown provider 'gpt'"),
])
def test_errors_name_the_exact_place(mutate, expected: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(json.dumps(SEED))
    mutate(data)
    with pytest.raises(RouterConfigError) as info:
        parse_config(data, source="route.json")
    assert expected in str(info.value), str(info.value)
    assert str(info.value).startswith("route.json") or "route.json" in str(info.value)


def test_all_problems_reported_at_once() -> None:
    data = json.loads(json.dumps(SEED))
    data["fallbackChain"].append("x1")
    data["defaultProvider"] = "x2"
    with pytest.raises(RouterConfigError) as info:
        parse_config(data)
    assert "'x1'" in str(info.value) and "'x2'" in str(info.value)


def test_errors_never_echo_a_key() -> None:
    data = json.loads(json.dumps(SEED))
    data["providers"]["anthropic"]["apiKey"] = 12345678901234  # wrong type
    data["providers"]["anthropic"]["api_kye"] = "sk-ant-supersecret-value"
    with pytest.raises(RouterConfigError) as info:
        parse_config(data)
    text = str(info.value)
    assert "apiKey" in text and "12345678901234" not in text and "supersecret" not in text


def test_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "r.json"
    bad.write_text('{"defaultProvider": "local",\n "providers": {,}}', encoding="utf-8")
    with pytest.raises(RouterConfigError, match=r"invalid JSON at line 2, column 16"):
        load_config(bad)
    bad_toml = tmp_path / "r.toml"
    bad_toml.write_text("defaultProvider = \n", encoding="utf-8")
    with pytest.raises(RouterConfigError, match="invalid TOML"):
        load_config(bad_toml)
    yaml = tmp_path / "r.yaml"
    yaml.write_text("a: 1", encoding="utf-8")
    with pytest.raises(RouterConfigError, match=r"must end in .json or .toml"):
        load_config(yaml)
    with pytest.raises(RouterConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_router_table_inside_a_bigger_toml(tmp_path: Path) -> None:
    p = tmp_path / "ortserve.toml"
    p.write_text('port = 9000\n[router]\ndefaultProvider = "local"\n', encoding="utf-8")
    assert load_config(p).default_provider == "local"


def test_docs_examples_are_valid_configs() -> None:
    """docs/router.md's TOML and JSON examples load and route as the doc says."""
    import re
    import tomllib

    from router_fakes import FakeEngine

    from ortserve.providers.base import ChatRequest, Hints
    from ortserve.router.router import Router
    from ortserve.types import Usage

    doc = (Path(__file__).parents[2] / "docs" / "router.md").read_text(encoding="utf-8")
    toml_block = re.search(r"```toml\n(.*?)```", doc, re.DOTALL).group(1)  # type: ignore[union-attr]
    json_block = re.search(r"```json\n(.*?)```", doc, re.DOTALL).group(1)  # type: ignore[union-attr]
    env = {"ANTHROPIC_API_KEY": "k" * 20, "OPENROUTER_API_KEY": "k" * 20}
    toml_router = Router.from_config(parse_config(tomllib.loads(toml_block)), local=FakeEngine(), env=env)
    json_router = Router.from_config(parse_config(json.loads(json_block)), local=FakeEngine(), env=env)

    def ask(r: Router, text: str, **hints: object) -> str:
        msg = [{"role": "user", "content": text}]
        return r.decide(ChatRequest(messages=msg, hints=Hints(**hints))).provider  # type: ignore[arg-type]

    assert ask(toml_router, "What is the capital of France?") == "local"
    assert ask(toml_router, "Refactor this parser and analyze its complexity", agent_type="coder") == "anthropic"
    assert ask(toml_router, "Prove it", complexity="high") == "openrouter"
    assert ask(toml_router, "Prove it", complexity="high", privacy="high") == "local"
    assert ask(json_router, "hi", privacy="high", local_only=True) == "onnx"
    assert ask(json_router, "word " * 300, complexity="medium") == "anthropic"
    million_in = Usage(1_000_000, 0)
    assert json_router.prices.cost("openrouter", "anthropic/claude-3.5-sonnet", False, million_in) == 3.0
