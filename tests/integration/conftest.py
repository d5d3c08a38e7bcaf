"""Fixtures shared by integration modules (the session-wide ones live in tests/conftest.py)."""

from tests.integration.lora_material import lora, lora_half  # noqa: F401 - LoRA adapters, merged models: built once
