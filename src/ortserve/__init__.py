"""ortserve: an offline-first LLM server and toolkit on ONNX Runtime GenAI."""

import os

# onnxruntime >= 1.32 and onnxruntime-genai 0.18 ship Microsoft's 1DS telemetry on every platform: on first
# use they write a device id and an event queue (process, OS, CPU, Python path, session events) under
# ~/.cache/Microsoft/DeveloperTools/.onnxruntime and upload it over HTTPS when a network appears. ortserve
# promises that nothing leaves the machine, so it is off unless the user sets ORT_DISABLE_TELEMETRY=0.
# It must be set before onnxruntime is first imported: the runtime reads it when its environment starts
# (calling ort.disable_telemetry_events() afterwards still leaves the queue written).
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__version__ = "0.1.0"
