"""`model: "auto"` on the server: the router picks local or cloud and says so in headers."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from router_fakes import FakeCloud
from servers import ServerThread


@pytest.fixture(scope="module")
def cloud():
    fake = FakeCloud("openai", reply="Hello from fake OpenRouter").start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def srv(tiny_model: Path, cloud: FakeCloud, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("route-home")
    cfg = home / "route.json"
    cfg.write_text(json.dumps({
        "defaultProvider": "openrouter", "fallbackChain": ["openrouter", "local"], "cooldownSeconds": 0,
        "providers": {"local": {"type": "local"},
                      "openrouter": {"type": "openai-compatible", "baseUrl": cloud.url,
                                     "apiKey": "sk-test-routing", "models": {"default": "openai/gpt-4o-mini"}}},
        "routing": {"rules": [{"condition": {"privacy": "high"}, "action": {"provider": "local"},
                               "reason": "private stays here"},
                              {"condition": {"complexity": "low"}, "action": {"provider": "local"},
                               "reason": "simple is free"}]}}), encoding="utf-8")
    with ServerThread(tiny_model, router_config=str(cfg), home=str(home)) as s:
        yield s


def test_private_auto_request_stays_local(srv: ServerThread, cloud: FakeCloud) -> None:
    cloud.reset()
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
        "model": "auto", "max_tokens": 8, "messages": [{"role": "user", "content": "my medical record says..."}],
        "metadata": {"privacy": "high", "complexity": "high"}})
    assert r.status_code == 200, r.text
    assert r.headers["x-ortserve-provider"] == "local" and "private" in r.headers["x-ortserve-route-reason"]
    assert r.json()["ortserve"]["local"] is True and r.json()["ortserve"]["cost_usd"] == 0
    assert cloud.requests == []


def test_complex_auto_request_goes_to_the_cloud_and_streams(srv: ServerThread, cloud: FakeCloud) -> None:
    cloud.reset()
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    r = client.chat.completions.with_raw_response.create(
        model="auto", max_tokens=8, messages=[{"role": "user", "content": "Design a distributed database."}],
        metadata={"complexity": "high"})
    assert r.headers["x-ortserve-provider"] == "openrouter"
    assert r.parse().choices[0].message.content == "Hello from fake OpenRouter"
    assert len(cloud.requests) == 1
    stream = client.chat.completions.create(model="auto", max_tokens=8, stream=True, metadata={"complexity": "high"},
                                            messages=[{"role": "user", "content": "Design a distributed database."}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Hello from fake OpenRouter"
    assert len(cloud.requests) == 2


def test_cloud_failure_falls_back_to_local(srv: ServerThread, cloud: FakeCloud) -> None:
    cloud.reset()
    cloud.script.extend(["500", "500", "500", "500"])
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
        "model": "auto", "max_tokens": 8, "messages": [{"role": "user", "content": "Prove a theorem."}],
        "metadata": {"complexity": "high"}})
    assert r.status_code == 200 and r.headers["x-ortserve-provider"] == "local"
    assert r.json()["ortserve"]["failed"]


def test_routed_fields_are_sent_or_refused_never_dropped(srv: ServerThread, cloud: FakeCloud) -> None:
    cloud.reset()
    high = {"complexity": "high"}
    msgs = [{"role": "user", "content": "hi"}]
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
        "model": "auto", "max_tokens": 8, "messages": msgs, "metadata": high, "seed": 5, "top_k": 30, "min_p": 0.1,
        "repetition_penalty": 1.1, "logit_bias": {"5": -100}})
    assert r.status_code == 200 and r.headers["x-ortserve-provider"] == "openrouter", r.text
    sent = cloud.requests[-1]["body"]
    assert (sent["seed"], sent["top_k"], sent["min_p"], sent["repetition_penalty"], sent["logit_bias"]) == (
        5, 30, 0.1, 1.1, {"5": -100.0})
    # OpenRouter has no typical_p: pinned, a 400 naming it; routed, the local engine (which has it) answers
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
        "model": "openrouter", "max_tokens": 8, "messages": msgs, "typical_p": 0.9})
    assert r.status_code == 400 and r.json()["error"]["param"] == "typical_p", r.text
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
        "model": "auto", "max_tokens": 8, "messages": msgs, "metadata": high, "typical_p": 0.9})
    assert r.status_code == 200 and r.headers["x-ortserve-provider"] == "local", r.text
    assert "cannot take 'typical_p'" in r.headers["x-ortserve-route-reason"]
    # speculation is the local engine's switch: the same, never silently dropped on a cloud answer
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
        "model": "openrouter", "max_tokens": 8, "messages": msgs, "speculative": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative", r.text
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={  # and a LoRA adapter's scale (lora.md)
        "model": "openrouter", "max_tokens": 8, "messages": msgs, "lora_scale": 0.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_scale", r.text
    r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
        "model": "auto", "max_tokens": 8, "messages": msgs, "metadata": high, "speculative": False})
    assert r.status_code == 200 and r.headers["x-ortserve-provider"] == "local", r.text
    for field, value in (("top_logprobs", 2), ("keep_alive", 0), ("n", 2),
                         ("functions", [{"name": "f", "parameters": {"type": "object"}}])):
        r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
            "model": "auto", "max_tokens": 8, "messages": msgs, "metadata": high, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert len(cloud.requests) == 1
