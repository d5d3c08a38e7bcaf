"""Vision-language import: Hugging Face directories and llama.cpp GGUF + mmproj pairs."""
