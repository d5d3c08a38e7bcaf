"""The generation engine: continuous batching over ONNX Runtime with a shared KV cache."""

from ortserve.engine.engine import AsyncEngine, LoadedModel, RequestHandle
from ortserve.engine.llm import LLM

__all__ = ["LLM", "AsyncEngine", "LoadedModel", "RequestHandle"]
