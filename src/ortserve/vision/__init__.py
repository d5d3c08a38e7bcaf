"""Images in, text out (issue 42): image decoding and limits, the Qwen2.5-VL preprocessing, and the
vision runner on onnxruntime-genai's multimodal generator (docs/vision.md)."""
