"""The router on the real AsyncEngine (tiny random Llama): local answers, streaming, lazy
loading from settings, and a private request that never reaches the (fake) cloud."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from router_fakes import FakeCloud

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.providers.base import ChatRequest, Delta, Hints
from ortserve.router.config import parse_config
from ortserve.router.costs import Ledger
from ortserve.router.router import ChatResult, Router, RouteStart
from ortserve.types import SamplingParams

PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _request(privacy: str | None = None) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": "Tell me about my medical history."}],
                       params=PARAMS, hints=Hints(privacy=privacy))  # type: ignore[arg-type]


@pytest.fixture()
def cloud() -> Any:
    fake = FakeCloud("anthropic").start()
    yield fake
    fake.stop()


def test_real_engine_answers_private_requests_locally(tiny_model: Path, tmp_path: Path,
                                                      cloud: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTSERVE_HOME", str(tmp_path))
    settings = load_settings(device="cpu")
    config = parse_config({
        "defaultProvider": "anthropic", "fallbackChain": ["anthropic", "local"],
        "providers": {"anthropic": {"baseUrl": cloud.url, "apiKey": "sk-ant-fake-0123456789",
                                    "models": {"default": "claude-sonnet-4-5"}, "maxRetries": 0}}})

    async def main() -> tuple[ChatResult, list[Any], ChatResult, ChatResult]:
        engine = AsyncEngine.load(tiny_model, settings)
        await engine.start()
        try:
            router = Router.from_config(config, local=engine, ledger=Ledger(settings.ledger_path))
            private = await router.chat(_request("high"))
            events = [ev async for ev in router.stream(_request("high"))]
            public = await router.chat(_request())  # not private: the default (cloud) answers
            await router.aclose()
            return private, events, events[-1], public
        finally:
            await engine.stop()

    private, events, final, public = asyncio.run(main())
    assert private.provider == "local" and private.model == final.model == events[0].model
    assert private.cost_usd == 0.0 and private.local
    assert private.usage.prompt_tokens > 5 and private.usage.completion_tokens == 8
    assert isinstance(events[0], RouteStart) and events[0].provider == "local"
    assert "".join(e.text for e in events if isinstance(e, Delta)) == final.text
    assert final.usage.completion_tokens == 8 and final.text == private.text  # greedy: same answer
    assert public.provider == "anthropic"
    assert len(cloud.requests) == 1  # only the public request went out
    assert "medical" in cloud.requests[0]["body"]["messages"][0]["content"]
    report = Ledger(settings.ledger_path).report()
    assert report.requests == 3 and report.cost_usd == pytest.approx(public.cost_usd)


def test_router_from_settings_loads_the_engine_lazily(tiny_model: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTSERVE_HOME", str(tmp_path))
    monkeypatch.delenv("ORTSERVE_ROUTER_CONFIG", raising=False)
    settings = load_settings(model=str(tiny_model), device="cpu")
    router = Router.from_settings(settings)
    local = router.provider("local")
    assert local.ready and getattr(local, "engine", None) is None  # nothing loaded by construction

    async def main() -> ChatResult:
        try:
            return await router.chat(_request())
        finally:
            await router.aclose()

    res = asyncio.run(main())
    assert res.provider == "local" and res.usage.completion_tokens == 8
    assert getattr(local, "engine", None) is None  # aclose stopped the engine it loaded
