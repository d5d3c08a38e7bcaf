"""ortserve: an offline-first LLM server and toolkit on ONNX Runtime GenAI."""

__version__ = "0.1.0"
