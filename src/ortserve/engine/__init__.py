"""The generation engine: continuous batching over ONNX Runtime with a shared KV cache."""

from ortserve.engine.engine import AsyncEngine, LoadedModel, RequestHandle

__all__ = ["AsyncEngine", "LoadedModel", "RequestHandle"]
