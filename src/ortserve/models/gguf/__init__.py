"""GGUF import: the exact and native graphs written from a GGUF file's metadata and blocks."""
