"""Real HTTP fakes on 127.0.0.1 for the router tests: one speaks the Anthropic Messages API,
one the OpenAI chat completions API (both streaming and not). A script of behaviours per
request injects failures: "ok", "500", "503", "429", "400", "401", "404", "timeout",
"sse-error" (HTTP 200, then an error event before any text), "break" (text, then the
connection dies mid-stream).

Tool calls: with `calls` set ([(name, arguments JSON)]), a request that carries tools is
answered with those calls in the server's own protocol (OpenAI `tool_calls`, Anthropic
`tool_use` blocks; a forced Anthropic tool answers under its own name), streamed in
`piece`-character argument pieces."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from clocks import wait_until
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ortserve.errors import InvalidRequest
from ortserve.loopback import free_port
from ortserve.types import Metrics, SamplingParams, TokenEvent


@dataclass
class FakeCloud:
    """kind: 'anthropic' or 'openai'."""

    kind: str
    reply: str = "Hello from the cloud"
    script: list[str] = field(default_factory=list)
    sleep: float = 3.0
    echo_key: bool = True
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    calls: list[tuple[str, str]] = field(default_factory=list)
    piece: int = 4

    def pieces(self, arguments: str) -> list[str]:
        return [arguments[i:i + self.piece] for i in range(0, len(arguments), self.piece)]

    @property
    def body(self) -> dict[str, Any]:
        """The last upstream request body."""
        return self.requests[-1]["body"]

    @property
    def url(self) -> str:
        base = f"http://127.0.0.1:{self.port}"
        return base if self.kind == "anthropic" else base + "/v1"

    def key_header(self, headers: Any) -> str:
        if self.kind == "anthropic":
            return str(headers.get("x-api-key", ""))
        return str(headers.get("authorization", "")).removeprefix("Bearer ")

    # -- server lifecycle --------------------------------------------------------------------
    def start(self) -> FakeCloud:
        self.port = free_port()
        config = uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        # a loaded machine starts the thread late, never wrongly: the bound only guards a hang
        if not wait_until(lambda: self._server.started):
            raise RuntimeError("fake server did not start")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)

    def reset(self) -> None:
        self.requests.clear()
        self.script.clear()
        self.calls.clear()

    # -- the app -----------------------------------------------------------------------------
    def app(self) -> FastAPI:
        app = FastAPI()
        path = "/v1/messages" if self.kind == "anthropic" else "/v1/chat/completions"

        @app.post(path)
        async def handle(request: Request) -> Response:
            body = await request.json()
            self.requests.append({"headers": dict(request.headers), "body": body})
            action = self.script.pop(0) if self.script else "ok"
            if action == "timeout":
                await asyncio.sleep(self.sleep)
                action = "ok"
            if action.isdigit():
                return self.error(int(action), self.key_header(request.headers))
            words = [w + " " for w in self.reply.split(" ")]
            words[-1] = words[-1].rstrip()
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
            if self.calls and body.get("tools"):
                return self.tool_answer(body, prompt_tokens)
            if body.get("stream"):
                gen = self.anthropic_sse if self.kind == "anthropic" else self.openai_sse
                return StreamingResponse(gen(body, words, prompt_tokens, action),
                                         media_type="text/event-stream")
            if self.kind == "anthropic":
                return JSONResponse({
                    "id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
                    "content": [{"type": "text", "text": self.reply}], "stop_reason": "end_turn",
                    "stop_sequence": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": len(words)}})
            return JSONResponse({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                "model": body["model"], "choices": [{"index": 0, "finish_reason": "stop",
                                                     "message": {"role": "assistant", "content": self.reply},
                                                     "logprobs": self.logprobs(body, words)}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                          "total_tokens": prompt_tokens + len(words)}})

        return app

    def logprobs(self, body: dict[str, Any], words: list[str]) -> dict[str, Any] | None:
        """OpenAI's choice.logprobs when the request asked for them: one entry per word, made up."""
        if not body.get("logprobs"):
            return None
        top = int(body.get("top_logprobs") or 0)
        return {"content": [{"token": w, "logprob": -0.25, "bytes": list(w.encode()),
                             "top_logprobs": [{"token": w, "logprob": -0.25, "bytes": list(w.encode())}] * top}
                            for w in words], "refusal": None}

    def answer_calls(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        forced = body.get("tool_choice") or {}
        if self.kind == "anthropic" and forced.get("type") == "tool":  # one call, to the forced tool
            return [(forced["name"], self.calls[0][1])]
        return list(self.calls)

    def tool_answer(self, body: dict[str, Any], prompt_tokens: int) -> Response:
        calls = self.answer_calls(body)
        if body.get("stream"):
            gen = self.anthropic_tool_sse if self.kind == "anthropic" else self.openai_tool_sse
            return StreamingResponse(gen(body, calls), media_type="text/event-stream")
        if self.kind == "anthropic":
            content = [{"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": json.loads(a)}
                       for i, (n, a) in enumerate(calls)]
            return JSONResponse({"id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
                                 "content": content, "stop_reason": "tool_use", "stop_sequence": None,
                                 "usage": {"input_tokens": prompt_tokens, "output_tokens": 9}})
        tool_calls = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                      for i, (n, a) in enumerate(calls)]
        return JSONResponse({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": tool_calls}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 9, "total_tokens": prompt_tokens + 9}})

    async def openai_tool_sse(self, body: dict[str, Any], calls: list[tuple[str, str]]) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return f"data: {json.dumps(data)}\n\n".encode()

        yield chunk({"role": "assistant", "content": None})
        for i, (name, args) in enumerate(calls):
            yield chunk({"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function",
                                         "function": {"name": name, "arguments": ""}}]})
            for piece in self.pieces(args):
                yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                await asyncio.sleep(0)
        yield chunk({}, "tool_calls")
        yield b"data: [DONE]\n\n"

    async def anthropic_tool_sse(self, body: dict[str, Any], calls: list[tuple[str, str]]) -> AsyncIterator[bytes]:
        def ev(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        yield ev("message_start", {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"], "content": [],
            "stop_reason": None, "usage": {"input_tokens": 5, "output_tokens": 1}}})
        for i, (name, args) in enumerate(calls):
            yield ev("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {}}})
            yield ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                             "delta": {"type": "input_json_delta", "partial_json": ""}})
            for piece in self.pieces(args):
                yield ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                                 "delta": {"type": "input_json_delta", "partial_json": piece}})
                await asyncio.sleep(0)
            yield ev("content_block_stop", {"type": "content_block_stop", "index": i})
        yield ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                   "usage": {"output_tokens": 9}})
        yield ev("message_stop", {"type": "message_stop"})

    def error(self, status: int, key: str) -> JSONResponse:
        msg = f"fake failure {status}"
        if status == 401 and self.echo_key:
            msg = f"Incorrect API key provided: {key}"  # real APIs echo (part of) the key
        if self.kind == "anthropic":
            kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error",
                    529: "overloaded_error"}.get(status, "api_error")
            return JSONResponse({"type": "error", "error": {"type": kind, "message": msg}}, status_code=status)
        return JSONResponse({"error": {"message": msg, "type": "invalid_request_error", "code": None}},
                            status_code=status)

    async def anthropic_sse(self, body: dict[str, Any], words: list[str], prompt_tokens: int,
                            action: str) -> AsyncIterator[bytes]:
        def ev(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        yield ev("message_start", {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"], "content": [],
            "stop_reason": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": 1}}})
        if action == "sse-error":
            yield ev("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            return
        yield ev("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}})
        yield ev("ping", {"type": "ping"})
        for i, w in enumerate(words):
            yield ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                             "delta": {"type": "text_delta", "text": w}})
            await asyncio.sleep(0)
            if action == "break" and i == 1:
                raise RuntimeError("connection dies mid-stream")
        yield ev("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                      "stop_sequence": None},
                                   "usage": {"output_tokens": len(words)}})
        yield ev("message_stop", {"type": "message_stop"})

    async def openai_sse(self, body: dict[str, Any], words: list[str], prompt_tokens: int,
                         action: str) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
            data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                    "model": body["model"], "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                                         "finish_reason": finish}]}
            return f"data: {json.dumps(data)}\n\n".encode()

        yield b": OPENROUTER PROCESSING\n\n"
        if action == "sse-error":
            yield f"data: {json.dumps({'error': {'message': 'upstream overloaded', 'code': 502}})}\n\n".encode()
            return
        yield chunk({"role": "assistant", "content": ""})
        for i, w in enumerate(words):
            yield chunk({"content": w}, logprobs=self.logprobs(body, [w]))
            await asyncio.sleep(0)
            if action == "break" and i == 1:
                raise RuntimeError("connection dies mid-stream")
        yield chunk({}, "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                     "total_tokens": prompt_tokens + len(words)}
            data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                    "model": body["model"], "choices": [], "usage": usage}
            yield f"data: {json.dumps(data)}\n\n".encode()
        yield b"data: [DONE]\n\n"


class FakeEngine:
    """Just enough of AsyncEngine for the layers above it: echoes a fixed reply word by word."""

    def __init__(self, reply: str = "local answer here", model_id: str = "tiny-local",
                 fail_with: Exception | None = None) -> None:
        self.reply = reply
        self.model_id = model_id
        self.context_length = 2048
        self.fail_with = fail_with
        self.submitted: list[dict[str, Any]] = []
        self.aborted: list[str] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def submit(self, *, messages: Any = None, prompt: Any = None, params: SamplingParams | None = None,
               request_id: str | None = None) -> AsyncIterator[TokenEvent]:
        if self.fail_with is not None:
            raise self.fail_with
        if not messages and not prompt:
            raise InvalidRequest("empty")
        rid = request_id or "req"
        self.submitted.append({"messages": messages, "params": params, "request_id": rid})
        return self._events(rid, messages)

    async def _events(self, rid: str, messages: Any) -> AsyncIterator[TokenEvent]:
        words = self.reply.split(" ")
        n_in = sum(len(str(m["content"]).split()) for m in messages)
        for i, w in enumerate(words):
            last = i == len(words) - 1
            await asyncio.sleep(0)
            yield TokenEvent(rid, w + ("" if last else " "), finished=last,
                             finish_reason="stop" if last else None,
                             metrics=Metrics(self.model_id, n_in, len(words)) if last else None)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


DEMO_CONFIG: dict[str, Any] = {
    "defaultProvider": "anthropic",
    "fallbackChain": ["anthropic", "local"],
    "providers": {"anthropic": {"models": {"default": "claude-sonnet-4-5"}, "maxRetries": 0,
                                "apiKey": "sk-ant-demo-not-a-real-key"}},
    "routing": {"rules": [
        {"condition": {"privacy": "high"}, "action": {"provider": "local"}, "reason": "private stays local"},
        {"condition": {"complexity": "low"}, "action": {"provider": "local"}, "reason": "simple work is free"},
    ]},
}


async def demo(home: str) -> None:
    """Route a small mixed workload through a fake Anthropic server and a fake engine, writing
    HOME/costs.sqlite, so `ORTSERVE_HOME=HOME ortserve costs` has something to report."""
    from pathlib import Path

    from ortserve.providers.base import ChatRequest, Hints
    from ortserve.router.config import parse_config
    from ortserve.router.costs import Ledger
    from ortserve.router.router import Router

    cloud = FakeCloud("anthropic", reply=" ".join(["word"] * 300)).start()
    config = json.loads(json.dumps(DEMO_CONFIG))
    config["providers"]["anthropic"]["baseUrl"] = cloud.url
    engine = FakeEngine(reply=" ".join(["local"] * 200))
    router = Router.from_config(parse_config(config), local=engine, ledger=Ledger(Path(home) / "costs.sqlite"))
    long = "Design a distributed rate limiter and analyze the trade-offs. " + "context " * 1500
    work = [("What is the capital of France?", Hints())] * 6 + [("Summarise my medical notes " + "note " * 800,
                                                                  Hints(privacy="high"))] * 2
    work += [(long, Hints())] * 3
    try:
        for text, hints in work:
            r = await router.chat(ChatRequest(messages=[{"role": "user", "content": text}], hints=hints))
            print(f"{r.provider:<10} {r.model:<18} {r.cost_usd:.6f} USD  {r.reason}")
        cloud.script.append("503")
        r = await router.chat(ChatRequest(messages=[{"role": "user", "content": long}]))
        print(f"{r.provider:<10} {r.model:<18} {r.cost_usd:.6f} USD  {r.reason}")
    finally:
        await router.aclose()
        cloud.stop()


if __name__ == "__main__":
    import sys

    asyncio.run(demo(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ortserve-route-demo"))
