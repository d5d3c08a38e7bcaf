"""Each family's random GGUF (tests/llamacpp.py's real vocabularies, test_gguf_families' writer),
imported once per session through the streamed importer, for tests that serve them: the tool
choice checks (test_tool_required_families.py) and the model x route matrix.

``llama3.2-1b`` is the issue 46 case: Llama 3's ``llama-bpe`` vocabulary (128,256 tokens and rows),
whose transformers conversion adds an ``<|endoftext|>`` one id past the rows. A linear rope
scaling sends it down the streamed path at this small size, as a large file would go.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_gguf_families import CASES, write

Q4K = dict.fromkeys(("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"), "Q4_K")
LLAMA_BPE: dict[str, Any] = {"arch": "llama", "vocab": "llama-bpe", "heads": 4, "kv": 2, "head_dim": 64,
                             "rope_dim": 64, "theta": 500000.0, "linear": 2.0, "embd": "Q4_K", "output": "Q6_K",
                             "types": Q4K, "template": "meta-llama-Llama-3.2-3B-Instruct"}
# a context long enough for a chat prompt with tools and 64 new tokens
FAMILIES: dict[str, dict[str, Any]] = {name: {**c, "context": 1024} for name, c in {
    "llama3.2-1b": LLAMA_BPE,
    "phi3.5-mini": {**CASES["phi3.5-mini"], "template": "microsoft-Phi-3.5-mini-instruct"},
    "phi4-mini": CASES["phi4-mini"],
    "gemma2": {**CASES["gemma2"], "template": "google-gemma-2-2b-it"},
    "gemma3": CASES["gemma3"],
}.items()}


def family_gguf(tmp: Path, name: str) -> Path:
    return write(tmp / f"{name}.gguf", FAMILIES[name])


def _key() -> str:
    """What the imports depend on: the writer, these cases and the importer's sources."""
    import hashlib

    from ortserve import models

    h = hashlib.sha256(repr(sorted(FAMILIES.items())).encode())
    for f in [Path(__file__).with_name("test_gguf_families.py"), *sorted(Path(models.__file__).parent.glob("gguf_*.py"))]:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def imported_family(name: str) -> Path:
    """The imported model of one family, cached under the test cache (tests/llamacpp.py's) by a hash
    of what makes it: about 2 minutes on 2 cores for all five the first time, none after."""
    import shutil
    import tempfile

    from tests.llamacpp import cache_dir

    from ortserve.models.gguf.fast import import_gguf_streamed

    out = cache_dir() / "families" / _key() / name
    if (out / "genai_config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        import_gguf_streamed(family_gguf(Path(tmp), name), Path(tmp) / "model", smoke=False)
        shutil.rmtree(out, ignore_errors=True)
        (Path(tmp) / "model").rename(out)   # whole or not at all
    for old in out.parent.parent.iterdir():   # imports of older sources are never read again
        if old != out.parent and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return out


@pytest.fixture(scope="session")
def family_models() -> dict[str, Path]:
    """name -> imported ONNX GenAI directory, for every family."""
    return {name: imported_family(name) for name in FAMILIES}
