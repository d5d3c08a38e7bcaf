"""The router against real HTTP fakes on 127.0.0.1 that speak the Anthropic Messages API and
the OpenAI chat completions API, with injected 500/429/timeouts/4xx."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from router_fakes import FakeCloud, FakeEngine, free_port

from ortserve.config import load_settings
from ortserve.errors import InvalidRequest, Overloaded, ProviderError, RequestTimeout, Unavailable
from ortserve.providers.base import ChatRequest, Delta, Hints
from ortserve.router.config import RouterConfigError, parse_config
from ortserve.router.costs import Ledger
from ortserve.router.router import ChatResult, Router, RouteStart
from ortserve.types import SamplingParams

ANTHROPIC_KEY = "sk-ant-api03-SECRETSECRET-0123456789abcdef"
OPENROUTER_KEY = "sk-or-v1-TOPSECRET-fedcba9876543210"
ENV = {"ANTHROPIC_API_KEY": ANTHROPIC_KEY, "OPENROUTER_API_KEY": OPENROUTER_KEY}


@pytest.fixture(scope="module")
def clouds() -> Iterator[tuple[FakeCloud, FakeCloud]]:
    a = FakeCloud("anthropic", reply="Hello from fake Anthropic").start()
    o = FakeCloud("openai", reply="Hello from fake OpenRouter").start()
    yield a, o
    a.stop()
    o.stop()


@pytest.fixture()
def anth(clouds: tuple[FakeCloud, FakeCloud]) -> FakeCloud:
    clouds[0].reset()
    return clouds[0]


@pytest.fixture()
def orouter(clouds: tuple[FakeCloud, FakeCloud]) -> FakeCloud:
    clouds[1].reset()
    return clouds[1]


def make_router(a: FakeCloud, o: FakeCloud, tmp: Path, engine: FakeEngine | None = None,
                rules: list[dict[str, Any]] | None = None, **top: Any) -> Router:
    opts = {"maxRetries": 0, "retryBackoff": 0, "timeout": 0.5}
    data = {
        "defaultProvider": "anthropic",
        "fallbackChain": ["anthropic", "openrouter", "local"],
        "cooldownSeconds": 0,
        "providers": {
            "anthropic": {"baseUrl": a.url, "models": {"default": "claude-sonnet-4-5"}, **opts},
            "openrouter": {"baseUrl": o.url, "models": {"default": "openai/gpt-4o-mini"}, **opts},
            "local": {"type": "local"},
        },
        "routing": {"rules": rules if rules is not None else [
            {"condition": {"complexity": "low"}, "action": {"provider": "local"}, "reason": "simple stays local"}]},
    }
    for k, v in top.items():
        if k in ("anthropic", "openrouter"):
            data["providers"][k].update(v)  # type: ignore[index]
        else:
            data[k] = v
    return Router.from_config(parse_config(data), local=engine or FakeEngine(), env=ENV,
                              ledger=Ledger(tmp / "costs.sqlite"))


def req(text: str = "Explain this please", params: SamplingParams | None = None, **hints: Any) -> ChatRequest:
    hints.setdefault("complexity", "high")
    return ChatRequest(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
                       params=params or SamplingParams(max_tokens=32, temperature=0.5, stop=("END",)),
                       hints=Hints(**hints))


async def collect(router: Router, request: ChatRequest) -> tuple[list[Any], ChatResult]:
    events = [ev async for ev in router.stream(request)]
    assert isinstance(events[0], RouteStart) and isinstance(events[-1], ChatResult)
    return events, events[-1]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def go(router: Router, aw: Any) -> Any:
    """Await `aw` in a fresh loop, then close the router's HTTP clients on that loop."""
    async def main() -> Any:
        try:
            return await aw
        finally:
            await router.aclose()

    return asyncio.run(main())


def test_anthropic_messages_chat_and_stream(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path)

    async def main() -> tuple[ChatResult, list[Any], ChatResult]:
        res = await router.chat(req("Explain this please"))
        events, final = await collect(router, req("Explain this please"))
        await router.aclose()
        return res, events, final

    res, events, final = run(main())
    assert (res.text, res.provider, res.model) == ("Hello from fake Anthropic", "anthropic", "claude-sonnet-4-5")
    # the fake counts words of `messages`; Anthropic takes the system prompt apart
    assert (res.usage.prompt_tokens, res.usage.completion_tokens, res.finish_reason) == (3, 4, "stop")
    assert res.cost_usd == pytest.approx((3 * 3 + 4 * 15) / 1e6)
    assert res.headers()["X-Ortserve-Provider"] == "anthropic"
    sent = anth.requests[0]
    assert sent["headers"]["x-api-key"] == ANTHROPIC_KEY and sent["headers"]["anthropic-version"] == "2023-06-01"
    assert sent["body"]["system"] == "Be brief." and sent["body"]["max_tokens"] == 32
    assert sent["body"]["messages"] == [{"role": "user", "content": "Explain this please"}]
    assert sent["body"]["stop_sequences"] == ["END"] and "stream" not in sent["body"]
    assert anth.requests[1]["body"]["stream"] is True
    deltas = [e.text for e in events if isinstance(e, Delta)]
    assert len(deltas) == 4 and "".join(deltas) == "Hello from fake Anthropic" == final.text
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (3, 4)
    assert events[0].provider == "anthropic" and final.cost_usd == res.cost_usd
    assert orouter.requests == []


def test_openai_compatible_chat_and_stream(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path)
    pinned = ChatRequest(messages=[{"role": "user", "content": "one two three"}], model="openrouter")

    async def main() -> tuple[ChatResult, ChatResult, list[Any]]:
        res = await router.chat(pinned)
        events, final = await collect(router, pinned)
        await router.aclose()
        return res, final, events

    res, final, events = run(main())
    assert (res.text, res.provider, res.model) == ("Hello from fake OpenRouter", "openrouter", "openai/gpt-4o-mini")
    assert (res.usage.prompt_tokens, res.usage.completion_tokens) == (3, 4)
    assert res.cost_usd == pytest.approx((3 * 0.15 + 4 * 0.6) / 1e6)
    assert orouter.requests[0]["headers"]["authorization"] == f"Bearer {OPENROUTER_KEY}"
    body = orouter.requests[1]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "".join(e.text for e in events if isinstance(e, Delta)) == final.text == res.text
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (3, 4)
    assert anth.requests == []


def test_rule_sends_simple_work_local_at_zero_cost(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    engine = FakeEngine()
    router = make_router(anth, orouter, tmp_path, engine=engine)
    res = go(router, router.chat(req("What is 2+2?", complexity=None)))
    assert (res.provider, res.text, res.cost_usd, res.reason) == ("local", "local answer here", 0.0,
                                                                  "simple stays local")
    assert engine.submitted[0]["params"].max_tokens == 32
    assert anth.requests == [] and orouter.requests == []


@pytest.mark.parametrize("hints", [{"privacy": "high"}, {"local_only": True}])
def test_private_requests_never_reach_a_cloud_server(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path,
                                                     hints: dict[str, Any]) -> None:
    everything_cloud = [{"condition": {}, "action": {"provider": "anthropic"}, "reason": "cloud for all"}]
    ok = make_router(anth, orouter, tmp_path, rules=everything_cloud)
    res = go(ok, ok.chat(req("my diagnosis is ...", **hints)))
    assert res.provider == "local" and "private" in res.reason
    _, final = go(ok, collect(ok, req("my diagnosis is ...", **hints)))
    assert final.provider == "local"
    # the local engine fails in a way that would normally fall back: still nothing leaves
    broken = make_router(anth, orouter, tmp_path, engine=FakeEngine(fail_with=Overloaded("queue full")),
                         rules=everything_cloud)
    with pytest.raises(ProviderError, match="queue full") as info:
        go(broken, broken.chat(req("my diagnosis is ...", **hints)))
    assert info.value.status == 429  # the one provider's own error, not a generic 503
    with pytest.raises(ProviderError, match="queue full"):
        go(broken, collect(broken, req("my diagnosis is ...", **hints)))
    # and pinning a cloud provider is refused, not sent
    with pytest.raises(Exception, match="private"):
        go(broken, broken.chat(ChatRequest(messages=[{"role": "user", "content": "x"}], hints=Hints(**hints),
                                    model="anthropic")))
    assert anth.requests == [] and orouter.requests == []


@pytest.mark.parametrize("failure", ["500", "503", "529", "429", "timeout", "401"])
def test_fallback_to_next_provider(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path, failure: str) -> None:
    router = make_router(anth, orouter, tmp_path)
    anth.script.append(failure)
    res = go(router, router.chat(req()))
    assert res.provider == "openrouter" and res.text == "Hello from fake OpenRouter"
    assert len(anth.requests) == 1 and len(orouter.requests) == 1
    assert len(res.failed) == 1 and res.failed[0].startswith("anthropic:")
    assert "fell back to openrouter" in res.reason


def test_fallback_order_down_the_whole_chain(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path)
    anth.script.append("500")
    orouter.script.append("429")
    res = go(router, router.chat(req()))
    assert res.provider == "local" and len(res.failed) == 2
    assert [f.split(":")[0] for f in res.failed] == ["anthropic", "openrouter"]
    anth.script.append("500")
    orouter.script.append("503")
    no_local = make_router(anth, orouter, tmp_path, fallbackChain=["anthropic", "openrouter"])
    with pytest.raises(Unavailable, match=r"no provider could answer: anthropic: .*500.*; openrouter: .*503"):
        go(no_local, no_local.chat(req()))


def test_connection_refused_falls_back(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    dead = FakeCloud("anthropic")
    dead.port = free_port()  # nothing listens here
    router = make_router(dead, orouter, tmp_path)
    res = go(router, router.chat(req()))
    assert res.provider == "openrouter" and "connection failed (ConnectError" in res.failed[0]


def test_stream_falls_back_before_the_first_byte(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path)
    anth.script.append("sse-error")  # HTTP 200, then an overloaded_error event before any text
    orouter.script.append("500")
    events, final = go(router, collect(router, req()))
    assert final.provider == "local" and events[0].provider == "local"
    assert "".join(e.text for e in events if isinstance(e, Delta)) == "local answer here"
    anth.reset()
    orouter.reset()
    orouter.script.append("sse-error")  # pinned: nothing to fall back to, the error is reported
    pinned = make_router(anth, orouter, tmp_path)
    with pytest.raises(ProviderError, match="upstream overloaded"):
        go(pinned, collect(pinned, ChatRequest(messages=[{"role": "user", "content": "x"}], model="openrouter")))
    assert anth.requests == []


def first_then_other(anth: FakeCloud, orouter: FakeCloud, first: str) -> tuple[FakeCloud, FakeCloud, list[Any]]:
    """(the fake asked first, the next one, rules sending everything to `first`)."""
    rules = [{"condition": {}, "action": {"provider": first}, "reason": f"all to {first}"}]
    return (anth, orouter, rules) if first == "anthropic" else (orouter, anth, rules)


@pytest.mark.parametrize("first", ["anthropic", "openrouter"])
def test_no_fallback_on_a_4xx_from_the_request(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path,
                                               first: str) -> None:
    asked, other, rules = first_then_other(anth, orouter, first)
    router = make_router(anth, orouter, tmp_path, rules=rules)
    asked.script += ["400", "422"]
    with pytest.raises(ProviderError) as info:
        go(router, router.chat(req()))
    assert info.value.status == 400 and not info.value.retryable
    assert "rejected the request (400): fake failure 400" in info.value.message
    assert info.value.to_openai()["error"]["type"] == "invalid_request_error"
    with pytest.raises(ProviderError) as info:
        go(router, collect(router, req()))
    assert info.value.status == 422
    assert len(asked.requests) == 2 and other.requests == []


@pytest.mark.parametrize("first", ["anthropic", "openrouter"])
def test_no_silent_switch_once_streaming_started(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path,
                                                 first: str) -> None:
    asked, other, rules = first_then_other(anth, orouter, first)
    router = make_router(anth, orouter, tmp_path, rules=rules)
    asked.script.append("break")
    seen: list[Any] = []

    async def main() -> None:
        async for ev in router.stream(req()):
            seen.append(ev)

    with pytest.raises(ProviderError, match="stream broke"):
        go(router, main())
    assert isinstance(seen[0], RouteStart) and seen[0].provider == first
    assert [e.text for e in seen[1:]] == ["Hello ", "from "]
    assert other.requests == []


@pytest.mark.parametrize("first", ["anthropic", "openrouter"])
@pytest.mark.parametrize("failure", ["timeout", "429", "sse-error"])
def test_stream_failure_before_first_byte_hands_over(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path,
                                                     first: str, failure: str) -> None:
    asked, other, rules = first_then_other(anth, orouter, first)
    router = make_router(anth, orouter, tmp_path, rules=rules)
    asked.script.append(failure)
    events, final = go(router, collect(router, req()))
    nxt = "openrouter" if first == "anthropic" else "anthropic"
    assert events[0].provider == final.provider == nxt and final.text == other.reply
    assert len(asked.requests) == 1 and len(other.requests) == 1
    assert final.failed[0].startswith(f"{first}:")


def test_retries_stay_on_the_provider_first(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path, anthropic={"maxRetries": 2})
    anth.script += ["503", "429"]
    res = go(router, router.chat(req()))
    assert res.provider == "anthropic" and len(anth.requests) == 3 and orouter.requests == []
    assert res.failed == []


def test_cooldown_skips_a_failing_provider(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path, cooldownSeconds=60)
    anth.script.append("500")
    assert go(router, router.chat(req())).provider == "openrouter"
    second = go(router, router.chat(req()))
    assert second.provider == "openrouter" and len(anth.requests) == 1  # not asked again while cooling
    assert any("cooling down" in n for n in router.decide(req()).notes)


def test_keys_never_in_logs_or_errors(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path,
                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # includes httpx and httpcore debug logs
    router = make_router(anth, orouter, tmp_path)
    anth.script.append("401")  # the fake echoes the key back, as real APIs do
    orouter.script.append("401")
    res = go(router, router.chat(req()))
    assert res.provider == "local"
    anth.script.append("401")
    with pytest.raises(ProviderError) as info:
        go(router, router.chat(ChatRequest(messages=[{"role": "user", "content": "x"}], model="anthropic")))
    texts = [caplog.text, str(info.value), info.value.message, repr(info.value.to_openai()), " ".join(res.failed),
             res.reason, repr(router.providers), repr(router.config), str(router.decide(req()).to_dict())]
    for key in (ANTHROPIC_KEY, OPENROUTER_KEY):
        for t in texts:
            assert key not in t and key[:12] not in t
    assert "Incorrect API key provided: ***" in info.value.message
    assert "anthropic answered 401" in caplog.text  # the user still learns which key is wrong


def test_ledger_totals_and_savings(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path)

    async def main() -> list[ChatResult]:
        out = [await router.chat(req("What is 2+2?", complexity=None)),
               await router.chat(req("hard one")),
               await router.chat(ChatRequest(messages=[{"role": "user", "content": "a b c"}], model="openrouter"))]
        out.append((await collect(router, req("Hi", complexity="low")))[1])
        await router.aclose()
        return out

    results = run(main())
    assert [r.provider for r in results] == ["local", "anthropic", "openrouter", "local"]
    report = router.ledger.report()  # type: ignore[union-attr]
    assert report.requests == 4
    assert report.cost_usd == pytest.approx(sum(r.cost_usd or 0 for r in results))
    by = {(r.provider, r.model): r for r in report.rows}
    assert by[("local", "tiny-local")].requests == 2 and by[("local", "tiny-local")].cost_usd == 0
    assert by[("anthropic", "claude-sonnet-4-5")].cost_usd == pytest.approx(results[1].cost_usd)
    baseline = sum((r.usage.prompt_tokens * 3 + r.usage.completion_tokens * 15) / 1e6 for r in results)
    assert report.baseline_usd == pytest.approx(baseline)
    assert report.savings_usd == pytest.approx(baseline - report.cost_usd)
    assert report.baseline_models == ["anthropic:claude-sonnet-4-5"]


def test_no_config_means_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("a network client was created")

    monkeypatch.setattr(httpx.AsyncClient, "__init__", refuse)
    monkeypatch.setattr(httpx.AsyncClient, "send", refuse)
    monkeypatch.delenv("ORTSERVE_ROUTER_CONFIG", raising=False)
    settings = load_settings(home=tmp_path)
    assert settings.router_config is None and settings.ledger_path.parent == tmp_path
    router = Router.from_settings(settings, local=FakeEngine(), env=ENV)
    assert list(router.providers) == ["local"]
    hard = req("Design a distributed system and analyze the trade-offs", complexity="high")
    res = go(router, router.chat(hard))
    _, final = go(router, collect(router, hard))
    assert res.provider == final.provider == "local" and res.cost_usd == 0
    assert Ledger(settings.ledger_path).report().requests == 2


# Every sampling field a routed request can set: (value, sent as, carried by OpenRouter, by Anthropic).
FIELDS: dict[str, tuple[Any, Any, bool, bool]] = {
    "seed": (7, 7, True, False),
    "presence_penalty": (0.5, 0.5, True, False),
    "frequency_penalty": (0.25, 0.25, True, False),
    "logit_bias": ({12: -100.0}, {"12": -100.0}, True, False),
    "top_k": (20, 20, True, True),
    "min_p": (0.1, 0.1, True, False),
    "repetition_penalty": (1.2, 1.2, True, False),
    "typical_p": (0.9, 0.9, False, False),
    "min_tokens": (4, 4, False, False),
}


@pytest.mark.parametrize("name", FIELDS)
def test_each_sampling_field_is_sent_or_refused_never_dropped(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path,
                                                              name: str) -> None:
    value, wire, by_openrouter, by_anthropic = FIELDS[name]
    router = make_router(anth, orouter, tmp_path)
    for provider, fake, carried in (("openrouter", orouter, by_openrouter), ("anthropic", anth, by_anthropic)):
        pinned = ChatRequest(messages=[{"role": "user", "content": "hi"}], model=provider,
                             params=SamplingParams(max_tokens=8, **{name: value}))
        if carried:
            go(router, router.chat(pinned))
            assert fake.requests[-1]["body"][name] == wire, provider
        else:
            with pytest.raises(InvalidRequest) as info:
                go(router, router.chat(pinned))
            assert info.value.param == name and info.value.status == 400, provider
    assert len(orouter.requests) == by_openrouter and len(anth.requests) == by_anthropic


def test_fields_at_their_neutral_value_are_not_sent(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path)
    for provider in ("anthropic", "openrouter"):
        go(router, router.chat(ChatRequest(messages=[{"role": "user", "content": "hi"}], model=provider,
                                           params=SamplingParams(max_tokens=8, seed=None, top_k=0))))
    assert not set(FIELDS) & set(anth.body) and not set(FIELDS) & set(orouter.body)
    assert "temperature" not in anth.body  # 1.0 is Anthropic's default; sent only when set otherwise


def test_anthropic_refuses_temperature_above_one(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path)
    with pytest.raises(InvalidRequest) as info:
        go(router, router.chat(ChatRequest(messages=[{"role": "user", "content": "hi"}], model="anthropic",
                                           params=SamplingParams(temperature=1.5))))
    assert info.value.param == "temperature" and anth.requests == []
    with pytest.raises(InvalidRequest) as info:  # the engine's own grammars (Python API) stay local
        go(router, router.chat(ChatRequest(messages=[{"role": "user", "content": "hi"}], model="openrouter",
                                           params=SamplingParams(regex="[0-9]+"))))
    assert info.value.param == "regex" and orouter.requests == []


def test_timeout_is_a_deadline_over_the_whole_routed_answer(anth: FakeCloud, orouter: FakeCloud,
                                                            tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path, anthropic={"timeout": 5}, openrouter={"timeout": 5})
    slow = req(params=SamplingParams(max_tokens=8, timeout=0.3))
    for call in (lambda: router.chat(slow), lambda: collect(router, slow)):
        anth.script.append("timeout")  # the fake answers, fine, after 3 s; the provider would wait 5
        with pytest.raises(RequestTimeout) as info:  # so a 504 at all is the deadline's decision
            go(router, call())
        assert info.value.status == 504 and info.value.code == "timeout"
    assert orouter.requests == []
    res = go(router, router.chat(req(params=SamplingParams(max_tokens=8, timeout=30))))
    assert res.provider == "anthropic" and "timeout" not in anth.body  # not a field of the protocol


def test_a_provider_that_cannot_carry_a_field_is_skipped(anth: FakeCloud, orouter: FakeCloud, tmp_path: Path) -> None:
    engine = FakeEngine()
    router = make_router(anth, orouter, tmp_path, engine=engine)
    seeded = req(params=SamplingParams(max_tokens=8, seed=3))
    res = go(router, router.chat(seeded))  # default anthropic has no seed: OpenRouter answers it
    assert res.provider == "openrouter" and "anthropic skipped because it cannot take 'seed'" in res.reason
    assert orouter.body["seed"] == 3 and anth.requests == []
    typical = req(params=SamplingParams(max_tokens=8, typical_p=0.5))
    res = go(router, router.chat(typical))  # neither cloud protocol has typical_p: the local engine does
    assert res.provider == "local" and engine.submitted[-1]["params"].typical_p == 0.5
    only_clouds = make_router(anth, orouter, tmp_path, fallbackChain=["anthropic", "openrouter"])
    with pytest.raises(InvalidRequest) as info:
        go(only_clouds, only_clouds.chat(typical))
    assert info.value.param == "typical_p"
    assert len(anth.requests) == 0 and len(orouter.requests) == 1


def test_extensions_say_which_extra_fields_a_compatible_server_takes(anth: FakeCloud, orouter: FakeCloud,
                                                                      tmp_path: Path) -> None:
    router = make_router(anth, orouter, tmp_path, openrouter={"extensions": ["typical_p", "min_tokens"]})
    go(router, router.chat(ChatRequest(messages=[{"role": "user", "content": "hi"}], model="openrouter",
                                       params=SamplingParams(max_tokens=8, typical_p=0.5, min_tokens=2))))
    assert (orouter.body["typical_p"], orouter.body["min_tokens"]) == (0.5, 2)
    with pytest.raises(InvalidRequest) as info:  # top_k is OpenRouter's by default, not in this list
        go(router, router.chat(ChatRequest(messages=[{"role": "user", "content": "hi"}], model="openrouter",
                                           params=SamplingParams(top_k=5))))
    assert info.value.param == "top_k" and "providers.openrouter.extensions" in info.value.message
    with pytest.raises(RouterConfigError, match=r"providers\.openrouter\.extensions: .*unknown sampling field"):
        make_router(anth, orouter, tmp_path, openrouter={"extensions": ["mirostat"]})
