"""Typed errors. Each knows its HTTP status and its OpenAI error type/code, so every
surface (HTTP, CLI) reports a user mistake the same way."""

from __future__ import annotations

from typing import Any


class OrtServeError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None
    retry_after: float | None = None  # seconds, sent as Retry-After (429/503)

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.hint = hint

    def to_openai(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def with_retry_after(self, seconds: float) -> OrtServeError:
        self.retry_after = seconds
        return self

    def one_line(self) -> str:
        return f"{self.message}" + (f" ({self.hint})" if self.hint else "")


class InvalidRequest(OrtServeError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class Unauthorized(OrtServeError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(OrtServeError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(OrtServeError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(OrtServeError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class Overloaded(OrtServeError):
    status = 429
    type = "rate_limit_error"
    code = "queue_full"


class Unavailable(OrtServeError):
    status = 503
    type = "server_error"
    code = "unavailable"

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after  # seconds, sent as Retry-After


class RequestTimeout(OrtServeError):
    """A request passed its deadline (the `timeout` setting or the request's own `timeout`)."""

    status = 504
    type = "server_error"
    code = "timeout"


class ModelError(OrtServeError):
    """A model directory or file that cannot be used; the message names the missing piece."""

    status = 500
    type = "server_error"
    code = "model_error"


class DependencyMissing(OrtServeError):
    status = 500
    code = "dependency_missing"


class OfflineError(OrtServeError):
    """Something needed the network and this machine has none."""

    status = 503
    code = "offline"


class StoreError(OrtServeError):
    status = 400
    type = "invalid_request_error"
    code = "store_error"


class StorageFull(StoreError):
    """The disk under ORTSERVE_HOME is full: nothing was written (HTTP 507 Insufficient Storage). A
    StoreError, so what catches a failed install catches this one too."""

    status = 507
    type = "server_error"
    code = "insufficient_storage"


def disk_full(exc: BaseException) -> bool:
    """An OSError ENOSPC/EDQUOT, or SQLite's SQLITE_FULL ("database or disk is full"), anywhere in the chain."""
    import errno

    full = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    seen: BaseException | None = exc
    for _ in range(16):       # a cause chain may loop
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in full:
            return True
        text = str(seen)
        if "No space left on device" in text or "database or disk is full" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class ProviderError(OrtServeError):
    """A provider failed. retryable says whether the next provider in a chain may try."""

    status = 502
    type = "api_error"
    code = "provider_error"

    def __init__(self, message: str, *, retryable: bool, status: int | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retryable = retryable
        if status is not None:
            self.status = status


def require_genai():  # type: ignore[no-untyped-def]
    """Import onnxruntime_genai or fail with the seed's message."""
    try:
        import onnxruntime_genai as og
    except ImportError as exc:  # pragma: no cover - exercised by the CLI test via env
        raise DependencyMissing(
            "onnxruntime-genai not installed",
            hint="pip install 'ortserve[cpu]' (GPU: 'ortserve[cuda]' or 'ortserve[directml]'; one of them only)",
        ) from exc
    return og
