"""The HTTP API on a real uvicorn server, driven by the official openai client and httpx."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from servers import ServerThread

MSG = [{"role": "user", "content": "Say something about the sea."}]


@pytest.fixture(scope="module")
def srv(tiny_model: Path):
    with ServerThread(tiny_model, max_tokens_cap=512, default_max_tokens=32) as s:
        yield s


@pytest.fixture()
def client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def sse_events(resp: httpx.Response) -> list:
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_healthz_reports_backend_device_and_model(srv: ServerThread) -> None:
    body = httpx.get(f"{srv.url}/healthz").json()
    assert body["status"] == "ok" and body["backend"] == "onnx-genai" and body["device"] == "cpu"
    assert body["model"] == "tiny" and body["execution_provider"] == "CPUExecutionProvider"
    assert Path(body["model_dir"]).is_dir() and body["uptime"] >= 0


def test_seed_chat_and_stream_agree(srv: ServerThread) -> None:
    req = {"model": "onnx-genai", "messages": MSG, "temperature": 0, "max_tokens": 20, "top_p": 0.9, "top_k": 50}
    body = httpx.post(f"{srv.url}/v1/chat", json=req, timeout=60).json()
    assert body["content"]
    m = body["metrics"]
    for key in ("ttft", "total_latency", "tokens_per_second", "output_tokens_per_second", "input_tokens",
                "output_tokens", "tpot", "model"):
        assert key in m
    assert m["output_tokens"] <= 20 and m["input_tokens"] > 0 and m["model"] == "tiny"
    with httpx.stream("POST", f"{srv.url}/v1/chat/stream", json=req, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp)
    tokens = [e["token"] for e in events if not e.get("done")]
    final = events[-1]
    assert final["done"] is True and final["token"] == "[DONE]" and final["metrics"]["output_tokens"] > 0
    assert len(tokens) > 1 and "".join(tokens) == body["content"]


def test_openai_chat_completion(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_openai_streaming_with_usage_matches_non_streaming(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0)
    stream = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_n_seed_and_stop(client: openai.OpenAI) -> None:
    kw = {"model": "tiny", "messages": MSG, "max_tokens": 12, "temperature": 1.0, "seed": 11}
    a = client.chat.completions.create(n=2, **kw)
    b = client.chat.completions.create(n=2, **kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.choices[0].message.content != a.choices[1].message.content
    full = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0)
    text = full.choices[0].message.content
    stop = text[5:8]
    cut = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completions_and_models(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens <= 10
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text
    models = client.models.list().data
    assert models[0].id == "tiny" and models[0].loaded is True  # the pinned model first; then the store's
    assert all(m.loaded is False for m in models[1:])


def test_text_response_format_is_what_we_do(srv: ServerThread) -> None:
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": MSG, "max_tokens": 4,
                                                           "response_format": {"type": "text"}}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None


def test_metrics_endpoint(srv: ServerThread) -> None:
    httpx.post(f"{srv.url}/v1/chat", json={"messages": MSG, "max_tokens": 4}, timeout=60)
    text = httpx.get(f"{srv.url}/metrics").text
    for name in ("ortserve_requests_total", "ortserve_tokens_total", "ortserve_time_to_first_token_seconds",
                 "ortserve_time_per_output_token_seconds", "ortserve_queue_depth", "ortserve_running_requests"):
        assert name in text
    assert 'route="/v1/chat",status="200"' in text
