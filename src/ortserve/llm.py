"""`LLM` for scripts, by store id or directory: the engine's facade over the model store.

    from ortserve.llm import LLM
    with LLM("smollm2-135m") as llm:    # a store id (the default model is imported on first use)
        print(llm.generate(["Hi"])[0].text)

The engine's own ``ortserve.engine.LLM`` takes a model directory or a ``LoadedModel``; finding
a directory for a store id is the model store's work (``models.locate``), which sits above the
engine, so the lookup happens here and the engine never imports ``models``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortserve.engine import LLM as EngineLLM
from ortserve.engine import LoadedModel

__all__ = ["LLM"]


class LLM(EngineLLM):
    def __init__(self, model: str | Path | LoadedModel, settings: Any = None) -> None:
        if not isinstance(model, LoadedModel):
            from ortserve.models.locate import looks_like_path, resolve_model_dir

            if settings is None and not looks_like_path(str(model)):
                from ortserve.config import load_settings

                settings = load_settings()           # a store id needs the store's location
            model_dir, model_id = resolve_model_dir(str(model), settings)
            from ortserve.server.engine_loader import draft_of

            model = LoadedModel(model_dir, settings, model_id, draft=draft_of(settings))  # ORTSERVE_DRAFT_MODEL
        super().__init__(model, settings)
