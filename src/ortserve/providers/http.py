"""What the cloud providers share: options, an httpx client with timeouts, retries with
backoff, failure classification (may the next provider try?) and an SSE reader."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from pydantic import Field, SecretStr, field_validator

from ortserve.errors import InvalidRequest, ProviderError
from ortserve.providers.base import Capabilities, ChatRequest, ProviderOptions, redact, refuse, resolve_alias

log = logging.getLogger("ortserve.providers")

# Statuses that say "this provider, now" rather than "this request": the next one may try.
RETRY_STATUSES = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
# The provider is misconfigured (bad key, unknown model): not the caller's fault either.
MISCONFIGURED_STATUSES = {401, 403, 404}
MAX_RETRY_AFTER = 10.0

# SamplingParams fields beyond temperature/top_p/max_tokens/stop, with their neutral value: a
# request that sets one to anything else needs a provider whose protocol carries it.
SAMPLING_EXTRAS: dict[str, object] = {
    "seed": None, "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_k": 0, "min_p": 0.0,
    "typical_p": 1.0, "repetition_penalty": 1.0, "min_tokens": 0, "logit_bias": (),
    "speculative": True,  # ortserve's own switch (docs/speculative.md): only the local engine has it
    "lora_scale": None,  # a LoRA adapter's per-request scale (docs/lora.md): the local engine's adapters only
}  # `timeout` is the router's: a deadline over the whole routed answer, whoever gives it


class HttpOptions(ProviderOptions):
    """Options every HTTP provider takes. Keys: `apiKey` in the file, else the env var
    named by `apiKeyEnv` (each provider has a default)."""

    models: dict[str, str] = Field(default_factory=dict,
                                   description="Aliases to model ids; 'default' answers model=None")
    base_url: str | None = Field(None, alias="baseUrl")
    api_key: SecretStr | None = Field(None, alias="apiKey")
    api_key_env: str | None = Field(None, alias="apiKeyEnv")
    timeout: float = Field(60.0, gt=0, description="Seconds to wait for each read")
    connect_timeout: float = Field(5.0, gt=0, alias="connectTimeout")
    max_retries: int = Field(2, ge=0, le=10, alias="maxRetries",
                             description="Retries on this provider before the next one tries")
    retry_backoff: float = Field(0.5, ge=0, alias="retryBackoff",
                                 description="First backoff in seconds; doubles each retry")
    max_context: int | None = Field(None, gt=0, alias="maxContext")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers")
    tools: bool = Field(True, description="False for a server without tool calling: the router then "
                                          "sends it no request with tools or response_format")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {v!r}")
        return v.rstrip("/")


class HttpProvider:
    """Base of the cloud providers. Subclasses define the wire transforms."""

    kind = "http"
    default_base_url = ""
    default_key_env: str | None = None
    key_required = True

    def __init__(self, name: str, options: HttpOptions, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.options = options
        env = os.environ if env is None else env
        key_env = options.api_key_env or self.default_key_env
        key = options.api_key.get_secret_value() if options.api_key else None
        self._key: str | None = key or (env.get(key_env) if key_env else None) or None
        self._key_env = key_env
        self.base_url = options.base_url or self.default_base_url
        self.capabilities = Capabilities(streaming=True, tools=options.tools, max_context=options.max_context,
                                         local=False)
        self._client_obj: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}(name={self.name!r}, base_url={self.base_url!r})"

    # -- what it can carry -------------------------------------------------------------------
    def carries(self) -> frozenset[str]:
        """Which SAMPLING_EXTRAS fields this provider's protocol sends upstream."""
        return frozenset()

    def refusal(self, request: ChatRequest) -> InvalidRequest | None:
        p = request.params
        for name in ("json_schema", "regex", "grammar"):  # the engine's own constraints (Python API)
            if getattr(p, name):
                return refuse(self.name, name, "grammars are the local engine's; for JSON send response_format")
        if p.logprobs is not None and "logprobs" not in self.carries():
            return refuse(self.name, "logprobs", f"the {self.kind} protocol has no log-probabilities")
        for name, neutral in SAMPLING_EXTRAS.items():
            if getattr(p, name) != neutral and name not in self.carries():
                return refuse(self.name, name, self.why_not(name))
        if (request.has_tool_parts or request.structured) and not self.capabilities.tools:
            param = "response_format" if not request.has_tool_parts else "tools" if request.tools is not None \
                else "tool_choice" if request.tool_choice is not None else "messages"
            return refuse(self.name, param, "its routing config says tools: false")
        return None

    def why_not(self, name: str) -> str:
        return f"the {self.kind} protocol has no such field"

    # -- readiness and models -------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._key is not None or not self.key_required

    @property
    def not_ready_reason(self) -> str | None:
        if self.ready:
            return None
        return f"no API key (set {self._key_env} or apiKey in the routing config)"

    def default_model(self) -> str:
        return resolve_alias(self.options.models, None)

    def resolve_model(self, model: str | None) -> str:
        return resolve_alias(self.options.models, model)

    def secrets(self) -> list[str]:
        return [self._key] if self._key else []

    # -- HTTP plumbing ----------------------------------------------------------------------
    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client_obj is None or self._client_loop is not loop:
            o = self.options
            timeout = httpx.Timeout(o.timeout, connect=o.connect_timeout)
            # transport retries cover connection setup only; status retries are ours
            transport = httpx.AsyncHTTPTransport(retries=0)
            self._client_obj = httpx.AsyncClient(timeout=timeout, transport=transport)
            self._client_loop = loop
        return self._client_obj

    async def aclose(self) -> None:
        if self._client_obj is not None:
            try:
                await self._client_obj.aclose()
            except RuntimeError:  # its loop is gone; nothing left to close
                pass
            self._client_obj = None

    def auth_headers(self) -> dict[str, str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def url(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    async def open(self, body: dict[str, Any], *, stream: bool) -> httpx.Response:
        """POST with retries; returns a 2xx response (open when stream=True: caller closes)."""
        client = self._client()
        headers = {**self.options.headers, **self.auth_headers(), "content-type": "application/json"}
        attempts = self.options.max_retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                request = client.build_request("POST", self.url(), json=body, headers=headers)
                resp = await client.send(request, stream=stream)
            except httpx.TimeoutException as exc:
                err = self._failure(f"timed out ({type(exc).__name__})", retryable=True, status=504)
                wait = None
            except httpx.TransportError as exc:
                err = self._failure(f"connection failed ({type(exc).__name__}: {exc})", retryable=True,
                                    status=502)
                wait = None
            else:
                if resp.status_code < 400:
                    return resp
                err, wait = await self._status_failure(resp)
                if not err.retryable:
                    raise err
            if last or (wait is not None and wait > MAX_RETRY_AFTER):
                raise err
            delay = wait if wait is not None else self.options.retry_backoff * (2 ** attempt)
            log.warning("%s: %s; retry %d/%d in %.1fs", self.name, err.message, attempt + 1,
                        attempts - 1, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _status_failure(self, resp: httpx.Response) -> tuple[ProviderError, float | None]:
        try:
            raw = (await resp.aread()).decode("utf-8", "replace")
        finally:
            await resp.aclose()
        status = resp.status_code
        detail = self.error_detail(raw)
        if status in RETRY_STATUSES or status >= 500:
            err = self._failure(f"upstream answered {status}: {detail}", retryable=True, status=status)
        elif status in MISCONFIGURED_STATUSES:
            log.warning("%s answered %d: check its key and model in the routing config", self.name, status)
            err = self._failure(f"upstream answered {status}: {detail}", retryable=True, status=502)
        else:
            err = self._failure(f"rejected the request ({status}): {detail}", retryable=False,
                                status=status)
        return err, _retry_after(resp.headers.get("retry-after"))

    def error_detail(self, raw: str) -> str:
        """The upstream error message, short and without secrets."""
        import json

        try:
            data = json.loads(raw)
            msg = data.get("error", {}).get("message") if isinstance(data, dict) else None
            raw = str(msg) if msg else raw
        except (ValueError, AttributeError):
            pass
        return redact(raw.strip()[:300], self.secrets())

    def _failure(self, what: str, *, retryable: bool, status: int) -> ProviderError:
        err = ProviderError(redact(f"{self.name}: {what}", self.secrets()), retryable=retryable,
                            status=status)
        if status < 500 and not retryable:
            err.type = "invalid_request_error"
        return err

    def broken_stream(self, exc: Exception, started: bool) -> ProviderError:
        return self._failure(f"stream broke ({type(exc).__name__})", retryable=not started, status=502)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


async def iter_sse(resp: httpx.Response) -> AsyncIterator[tuple[str | None, str]]:
    """(event, data) pairs of a Server-Sent Events body; comments are skipped."""
    event: str | None = None
    data: list[str] = []
    async for line in resp.aiter_lines():
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if data:
        yield event, "\n".join(data)
