"""Speech to text on Whisper (ONNX Runtime GenAI): audio decoding and limits, the windowed
decode loop with Whisper's timestamp and suppression rules, response formats, word error rate."""
