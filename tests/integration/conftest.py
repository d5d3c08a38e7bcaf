"""Fixtures shared by integration modules (the session-wide ones live in tests/conftest.py)."""

from tests.integration.family_models import family_models  # noqa: F401 - each family's random GGUF, imported once
from tests.integration.lora_material import lora, lora_half  # noqa: F401 - LoRA adapters, merged models: built once
