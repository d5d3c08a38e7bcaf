"""Rules, hints, the complexity estimate and Router.decide (no network: decide never calls)."""

from __future__ import annotations

import json

import pytest
from router_fakes import FakeEngine
from test_router_config import SEED

from ortserve.errors import InvalidRequest, NotFound, Unavailable
from ortserve.providers.base import ChatRequest, Hints
from ortserve.router.config import parse_config
from ortserve.router.router import Router
from ortserve.router.rules import estimate_complexity

KEYS = {"ANTHROPIC_API_KEY": "sk-ant-test-0123456789", "OPENROUTER_API_KEY": "sk-or-test-0123456789"}


def router(data: dict | None = None, env: dict | None = None, clock=None) -> Router:  # type: ignore[no-untyped-def]
    r = Router.from_config(parse_config(data if data is not None else SEED), local=FakeEngine(),
                           env=KEYS if env is None else env)
    if clock is not None:
        r._clock = clock
    return r


def ask(text: str, **hints: object) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}], hints=Hints(**hints))  # type: ignore[arg-type]


def test_complexity_estimate_is_simple_and_documented() -> None:
    assert estimate_complexity("What is the capital of France?", 7) == "low"
    assert estimate_complexity("Summarise this paragraph for me please", 300) == "medium"
    assert estimate_complexity("Design a distributed cache and analyze the trade-offs", 12) == "high"
    assert estimate_complexity("```python\ndef f(): pass\n```\nrefactor this", 15) == "high"
    assert estimate_complexity("hello " * 3000, 3000) == "high"
    assert estimate_complexity("def f(x): return x", 6) == "medium"  # code alone is not hard


def test_hints_from_metadata_and_headers() -> None:
    h = Hints.parse({"privacy": "HIGH", "complexity": "low", "agentType": "researcher"})
    assert (h.privacy, h.complexity, h.agent_type, h.private) == ("high", "low", "researcher", True)
    hh = Hints.from_headers({"X-Ortserve-Local-Only": "true", "X-Ortserve-Complexity": "normal"})
    assert hh.local_only and hh.private and hh.complexity == "medium"
    merged = Hints(privacy="high").merged(Hints(privacy="low", complexity="high"))
    assert merged.privacy == "high" and merged.complexity == "high"  # privacy only tightens
    with pytest.raises(InvalidRequest, match="'privacy' must be one of low, medium, high"):
        Hints.parse({"privacy": "secret"})
    with pytest.raises(InvalidRequest, match="local_only"):
        Hints.from_headers({"x-ortserve-local-only": "maybe"})


def test_rules_match_in_order() -> None:
    r = router()
    d = r.decide(ask("What is 2+2?", privacy="high", local_only=True))
    assert (d.provider, d.model, d.reason) == ("onnx", "tiny-local",  # the loaded engine answers
                                               "Privacy-sensitive tasks use local ONNX models")
    d = r.decide(ask("List three fruits", agent_type="researcher"))
    assert d.provider == "onnx" and d.reason == "Simple tasks use free local inference"
    assert d.facts.complexity == "low" and d.facts.complexity_estimated
    d = r.decide(ask("Design and analyze a distributed consensus algorithm step by step"))
    assert (d.provider, d.model) == ("anthropic", "claude-sonnet-4-5")
    assert d.reason.startswith("rule 3 matched (complexity=['high']")
    assert [f"{t.provider}:{t.model}" for t in d.chain] == [
        "anthropic:claude-sonnet-4-5", "openrouter:openai/gpt-4o-mini", "onnx:tiny-local"]
    d = r.decide(ask("Say hello", complexity="medium"))
    assert d.provider == "anthropic" and d.reason == "no rule matched: default provider"


def test_max_prompt_tokens_condition() -> None:
    data = json.loads(json.dumps(SEED))
    data["routing"]["rules"] = [{"condition": {"maxPromptTokens": 5}, "action": {"provider": "onnx"},
                                 "reason": "short prompts stay local"}]
    r = router(data)
    assert r.decide(ask("one two three")).provider == "onnx"  # FakeEngine counts words
    assert r.decide(ask("one two three four five six")).provider == "anthropic"


def test_privacy_high_never_plans_a_cloud_provider() -> None:
    data = json.loads(json.dumps(SEED))
    data["routing"]["rules"] = [{"condition": {}, "action": {"provider": "anthropic"}, "reason": "all cloud"}]
    r = router(data)
    for hints in ({"privacy": "high"}, {"local_only": True}):
        d = r.decide(ask("my medical record", **hints))
        assert [t.provider for t in d.chain] == ["onnx"], d.chain
        assert d.private and "anthropic skipped because the request is private" in d.reason
        assert any("openrouter: skipped, cloud provider" in n for n in d.notes)
    # not private: the rule's cloud choice stands
    assert r.decide(ask("my medical record", privacy="low")).provider == "anthropic"


def test_private_request_pinned_to_cloud_is_refused() -> None:
    r = router()
    req = ChatRequest(messages=[{"role": "user", "content": "x"}], hints=Hints(privacy="high"),
                      provider="anthropic")
    with pytest.raises(InvalidRequest, match="private"):
        r.decide(req)
    pinned = r.decide(ChatRequest(messages=[{"role": "user", "content": "x"}], model="anthropic:fast"))
    assert (pinned.provider, pinned.model, [t.provider for t in pinned.chain]) == (
        "anthropic", "claude-haiku-4-5", ["anthropic"])
    assert r.decide(ChatRequest(messages=[{"role": "user", "content": "x"}], provider="local")).provider == "onnx"
    with pytest.raises(NotFound, match="unknown provider 'gemini'"):
        r.decide(ChatRequest(messages=[{"role": "user", "content": "x"}], provider="gemini"))
    assert r.handles("auto") and r.handles("openrouter") and r.handles("anthropic:claude-x")
    assert not r.handles("smollm2-135m")


def test_provider_without_key_is_skipped_with_a_note() -> None:
    r = router(env={"OPENROUTER_API_KEY": "sk-or-test-0123456789"})
    d = r.decide(ask("Say hello", complexity="medium"))
    assert d.provider == "openrouter"
    assert "anthropic skipped because it is unavailable" in d.reason
    assert any("ANTHROPIC_API_KEY" in n for n in d.notes)
    with pytest.raises(Unavailable, match="no API key"):
        r.decide(ChatRequest(messages=[{"role": "user", "content": "x"}], provider="anthropic"))


def test_cooling_provider_moves_to_the_back() -> None:
    now = [100.0]
    r = router(clock=lambda: now[0])
    r._cool_until["anthropic"] = 130.0
    d = r.decide(ask("Say hello", complexity="medium"))
    assert [t.provider for t in d.chain] == ["openrouter", "onnx", "anthropic"]
    assert any("cooling down for 30s" in n for n in d.notes)
    now[0] = 131.0
    assert r.decide(ask("Say hello", complexity="medium")).provider == "anthropic"


def test_no_config_plans_local_only() -> None:
    from ortserve.router.config import RouterConfig

    r = Router.from_config(RouterConfig.local_only(), local=FakeEngine())
    d = r.decide(ask("Design a distributed system", complexity="high"))
    assert (d.provider, d.model, [t.provider for t in d.chain]) == ("local", "tiny-local", ["local"])
    assert r.baseline() is None


def test_providers_declare_capabilities_and_typed_options() -> None:
    from pydantic import ValidationError

    from ortserve.providers import (
        AnthropicOptions,
        AnthropicProvider,
        LocalProvider,
        OpenAICompatOptions,
        OpenAICompatProvider,
        Provider,
    )

    a = AnthropicProvider("anthropic", AnthropicOptions.model_validate({"models": {"default": "m"}}), env={})
    o = OpenAICompatProvider("openrouter", OpenAICompatOptions.model_validate({"models": {"default": "m"}}),
                             env={"OPENROUTER_API_KEY": "sk-or-abcdefghijkl"})
    local = LocalProvider(FakeEngine())
    for p in (a, o, local):
        assert isinstance(p, Provider) and p.capabilities.streaming
    assert local.capabilities.local and not a.capabilities.local and not o.capabilities.local
    assert local.capabilities.max_context == 2048
    assert not a.ready and o.ready and o.base_url == "https://openrouter.ai/api/v1"
    assert "sk-or" not in repr(o)
    with pytest.raises(ValidationError, match="extra"):
        AnthropicOptions.model_validate({"models": {"default": "m"}, "temprature": 1})


def test_hints_from_request_and_redaction() -> None:
    from ortserve.providers.base import redact

    h = Hints.from_request({"privacy": "low", "agent_type": "coder"}, {"X-Ortserve-Privacy": "high"})
    assert h.privacy == "high" and h.agent_type == "coder"
    assert Hints.from_request(None, None) == Hints()
    key = "sk-ant-api03-abcdefghijklmnop"
    text = f"bad key {key}; header Bearer {key}; truncated {key[:10]}..."
    assert key not in redact(text, [key]) and key[:8] not in redact(text, [key])
    assert "sk-proj-zzzzzzzzzzzz" not in redact("leaked sk-proj-zzzzzzzzzzzz here")
