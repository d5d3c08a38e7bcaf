"""ortserve's native GGUF kernels: the library, whether it is usable, and how a session gets it.

The shared library `libortserve_gguf.so` (built by `pip install` from csrc/, or by
`python -m ortserve.native.build`) holds the block kernels and two ONNX Runtime custom ops in the
domain `ortserve.gguf` (docs/native.md):

- `GgufMatMul(X float [..., K], W uint8 [N, row_bytes]) -> [..., N]`, attributes ggml_type, K, N
  (and swiglu=1: X is [..., 2K], a gate then an up, and the op multiplies silu(gate) * up)
- `GgufGather(W uint8 [V, row_bytes], ids int64 [...]) -> [..., K]`, attributes ggml_type, K, V
- `SkipRmsNorm(input, skip, gamma) -> (output, sum)`: SkipSimplifiedLayerNormalization's two
  outputs the graphs read

`status()` says whether they can be used here and, when not, why: disabled by setting, not built,
failed to load, or a CPU the kernels have no fast path for. Everything above asks it first and
falls back to the MatMulNBits graphs otherwise.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LIBRARY_NAME = "libortserve_gguf.so"  # build.py names the same file (it imports nothing of ortserve)
DOMAIN = "ortserve.gguf"
OPSET = 1
MATMUL_OP = "GgufMatMul"
GATHER_OP = "GgufGather"

# ggml type ids the kernels read (ggml.h's enum ggml_type)
TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
TYPE_NAMES = {v: k for k, v in TYPE_IDS.items()}
SUPPORTED_TYPES = frozenset(TYPE_IDS.values())
# elements per block and bytes per block, as the GGUF file holds them
BLOCK_ELEMS = {2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 12: 256, 13: 256, 14: 256}
BLOCK_BYTES = {2: 18, 3: 20, 6: 22, 7: 24, 8: 34, 12: 144, 13: 176, 14: 210}

_PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class NativeStatus:
    active: bool          # the ops may be used: built, loaded, enabled, a CPU with a fast path
    reason: str           # one line: why active, or why not
    isa: str              # what the kernels use: "avx512vnni", "avx2", "scalar", or "" when not loaded
    library: Path | None  # the library file, when there is one

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["library"] = str(self.library) if self.library else None
        return d


def row_bytes(ggml_type: int, k: int) -> int:
    """Bytes of one weight row of k elements in the GGUF file (k a multiple of the block)."""
    return k // BLOCK_ELEMS[ggml_type] * BLOCK_BYTES[ggml_type]


def library_path() -> Path | None:
    """The built library beside this package, or None when it was not built."""
    path = _PACKAGE_DIR / LIBRARY_NAME
    return path if path.is_file() else None


def status(enabled: bool | None = None, isa: str | None = None) -> NativeStatus:
    """Whether the ops can be used in this process, and why (settings read when not given)."""
    if enabled is None or isa is None:
        from ortserve.config import load_settings

        settings = load_settings()
        enabled = settings.native if enabled is None else enabled
        if isa is None and settings.native_isa != "auto":
            # The library also reads this variable itself, in every copy of it a process loads
            # (a model folder holds its own for onnxruntime-genai): a value from .env or the
            # config file reaches them all this way.
            os.environ.setdefault("ORTSERVE_NATIVE_ISA", settings.native_isa)
        isa = settings.native_isa if isa is None else isa
    return _status(enabled, isa)


@functools.cache
def _status(enabled: bool, isa: str) -> NativeStatus:
    path = library_path()
    if not enabled:
        return NativeStatus(False, "disabled by setting (ORTSERVE_NATIVE=0)", "", path)
    if not sys.platform.startswith("linux"):
        return NativeStatus(False, f"not built: the native library is built on Linux only ({sys.platform})",
                            "", None)
    if path is None:
        return NativeStatus(False, f"not built: no {LIBRARY_NAME} (no C compiler at install?); run "
                                   "`python -m ortserve.native.build`", "", None)
    try:
        lib = _load(path)
    except OSError as exc:
        return NativeStatus(False, f"failed to load: {exc}", "", path)
    missing = [s for s in ("RegisterCustomOps", "osg_isa", "osg_supported") if not hasattr(lib, s)]
    if missing:
        return NativeStatus(False, f"failed to load: {path.name} lacks {', '.join(missing)}", "", path)
    if isa != "auto":
        if not hasattr(lib, "osg_set_isa") or lib.osg_set_isa(isa.encode()) != 0:
            used = lib.osg_isa().decode()
            return NativeStatus(False, f"CPU unsupported: ORTSERVE_NATIVE_ISA={isa} is not available here "
                                       f"(best: {used})", used, path)
        return NativeStatus(True, f"active: {isa} kernels (forced by ORTSERVE_NATIVE_ISA)", isa, path)
    used = lib.osg_isa().decode()
    if used == "scalar":
        return NativeStatus(False, "CPU unsupported: no AVX2, and the scalar kernels are slower than "
                                   "MatMulNBits", used, path)
    return NativeStatus(True, f"active: {used} kernels{_stale_note(path)}", used, path)


def _stale_note(path: Path) -> str:
    from ortserve.native import build  # not at import: `python -m ortserve.native.build` runs it as __main__

    return "; the library is older than csrc/ (rebuild: python -m ortserve.native.build)" \
        if build.stale(path, _PACKAGE_DIR / "csrc") else ""


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    if hasattr(lib, "osg_isa"):
        lib.osg_isa.restype = ctypes.c_char_p
        lib.osg_isa.argtypes = []
    if hasattr(lib, "osg_set_isa"):
        lib.osg_set_isa.restype = ctypes.c_int
        lib.osg_set_isa.argtypes = [ctypes.c_char_p]
    return lib


def library_features(library: Path | None) -> frozenset[str]:
    """What a copy of the library offers beyond the two ops of version 1 (``osg_features``):
    ``swiglu`` (GgufMatMul's attribute) and ``skip_rms_norm`` (the SkipRmsNorm op).
    Empty for no file, a file that does not load, or a copy older than the list."""
    if library is None or not Path(library).is_file():
        return frozenset()
    try:
        lib = _load(Path(library))
    except OSError:
        return frozenset()
    if not hasattr(lib, "osg_features"):
        return frozenset()
    lib.osg_features.restype = ctypes.c_char_p
    return frozenset(lib.osg_features().decode().split())


def register(session_options: Any, native: NativeStatus | None = None) -> bool:
    """Adds the ops to an onnxruntime.SessionOptions when they are active; True when added."""
    native = native or status()
    if not native.active or native.library is None:
        return False
    session_options.register_custom_ops_library(str(native.library))
    return True


def custom_ops_library(model_dir: Path, part: str = "decoder") -> Path | None:
    """The custom-op library a model folder's ``part`` graph needs (genai_config.json's
    ``model.<part>.session_options.custom_ops_library``, a file inside the folder: these kernels, as
    models/gguf/native.py and models/whisper/graph.py install them), or None."""
    import json

    try:
        cfg = json.loads((Path(model_dir) / "genai_config.json").read_text(encoding="utf-8"))
        name = cfg["model"][part].get("session_options", {}).get("custom_ops_library")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (Path(model_dir) / name).resolve() if isinstance(name, str) and name else None


def session_library(model_dir: Path, part: str = "decoder", native: NativeStatus | None = None) -> Path | None:
    """The custom-op library ortserve's own sessions load for a model folder's ``part`` graph: None
    when the folder names none; this package's build when the ops are active here; else the
    folder's copy. The folder's copy is as old as the folder's import and is what
    onnxruntime-genai loads. The package's build runs every graph an older copy ran (the ops only
    gain optional attributes and new ops), so a folder gets the kernels of the installed ortserve without a
    re-import."""
    lib = custom_ops_library(model_dir, part)
    if lib is None:
        return None
    native = native or status()
    return native.library if native.active and native.library is not None else lib


def register_custom_ops(so: Any, model_dir: Path, part: str = "decoder", native: NativeStatus | None = None) -> Any:
    """Register the custom-op library for a model folder's ``part`` (``session_library``), if it
    names one, in ``so``; returns ``so``."""
    lib = session_library(model_dir, part, native)
    if lib is not None:
        so.register_custom_ops_library(str(lib))
    return so


def install_into(folder: Path, library: Path | None = None) -> Path | None:
    """Copies ``library`` (default: this package's build, when the ops are active) into a model
    folder, where onnxruntime-genai loads a ``custom_ops_library`` from; replaced through a
    temporary file when it differs. Returns the copy, or None when there is nothing to copy. The
    importers call it (models/gguf/native.py ``install_library``); calling it on an older folder
    gives onnxruntime-genai the installed kernels too."""
    if library is None:
        native = status()
        library = native.library if native.active else None
    if library is None:
        return None
    target = Path(folder) / LIBRARY_NAME
    if not target.is_file() or target.read_bytes() != Path(library).read_bytes():
        partial = target.with_name(target.name + ".tmp")
        shutil.copyfile(library, partial)
        partial.replace(target)
    return target


def ensure_domain(model: Any) -> None:
    """Add the ops' domain to an onnx ``model``'s opset imports, unless it is there."""
    from onnx import helper

    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, OPSET))
