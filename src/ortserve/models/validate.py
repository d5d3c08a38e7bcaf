"""Checks run on user-supplied model files *before* any of their contents is trusted.

- ``check_gguf``: a bounds-checked GGUF header reader (every length, count and tensor
  offset is compared with the file size before use), plus an architecture check.
- ``check_hf_dir``: a Hugging Face directory has config, weights, tokenizer and an
  architecture the ONNX Runtime GenAI builder knows.
- ``check_onnx_dir``: an ONNX GenAI directory has genai_config.json, the ONNX file it
  names and tokenizer.json, and no file (external data, symlink, config path) points
  outside the directory.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import re
import struct
from pathlib import Path
from typing import Any

from ortserve.errors import DependencyMissing, ModelError
from ortserve.models.gguf_vocab import check_rows

# GGUF architectures that transformers can dequantize AND the builder can export.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM", "nemotron": "NemotronForCausalLM", "lfm2": "Lfm2ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
# Used when the builder's source cannot be read; the live list is parsed from it.
_FALLBACK_BUILDER_ARCHS = frozenset(GGUF_ARCHITECTURES.values()) | {
    "PhiForCausalLM", "GemmaForCausalLM", "GraniteForCausalLM", "OlmoForCausalLM", "SmolLM3ForCausalLM"}

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4


class _Reader:
    """Little-endian reads from a buffer; every read is bounds-checked."""

    def __init__(self, buf: Any, path: Path) -> None:
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def fail(self, what: str) -> ModelError:
        return ModelError(f"GGUF file {self.path.name} is truncated or corrupt ({what})",
                          hint="re-download or re-copy the file; check its size")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} runs past the end of the file at byte {self.pos}")

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _GGUF_SCALARS:
            return self.scalar(_GGUF_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY and depth == 0:
            itype = self.scalar("<I", what)
            count = self.scalar("<Q", what)
            min_item = struct.calcsize(_GGUF_SCALARS[itype]) if itype in _GGUF_SCALARS else 8
            self.need(count * min_item, f"array {what}")
            if itype == _STRING or count <= 64:
                items = [self.value(itype, what, depth + 1) for _ in range(count)]
                return items if count <= 64 else len(items)
            self.pos += count * min_item  # large numeric arrays (token scores): skip, keep the count
            return count
        raise self.fail(f"unknown value type {vtype} for {what}")


def has_gguf_magic(path: Path) -> bool:
    """Whether the file starts with GGUF's magic (OSError where it cannot be read)."""
    with Path(path).open("rb") as f:
        return f.read(4) == b"GGUF"


def check_gguf(path: Path) -> dict[str, Any]:
    """Validate a GGUF file's header and tensor table against its size; return its facts."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"GGUF file {path} does not exist", hint="check the path")
    size = path.stat().st_size
    try:
        import gguf  # noqa: F401  (type sizes for the tensor bounds check)
    except ImportError as exc:
        raise DependencyMissing("reading GGUF files needs the gguf package",
                                hint="pip install 'ortserve[convert]'") from exc
    if size < 24:
        raise ModelError(f"GGUF file {path.name} is truncated ({size} bytes)", hint="re-download the file")
    with Path(path).open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        r = _Reader(mm, path)
        if bytes(mm[:4]) != b"GGUF":
            raise ModelError(f"{path.name} is not a GGUF file (bad magic)",
                             hint="import takes a .gguf file, a Hugging Face or an ONNX GenAI directory")
        r.pos = 4
        version = r.scalar("<I", "version")
        if version not in (2, 3):
            raise ModelError(f"{path.name}: unsupported GGUF version {version}", hint="use GGUF v2 or v3")
        n_tensors, meta = _metadata(r)
        tensors = [_tensor_info(r) for _ in range(n_tensors)]
        align = int(meta.get("general.alignment", 32))
        if align <= 0 or align & (align - 1):
            raise r.fail(f"alignment {align} is not a power of two")
        data_start = (r.pos + align - 1) // align * align
        for name, ggml_type, n_bytes, offset, _dims in tensors:
            if offset % align:
                raise r.fail(f"tensor {name} offset {offset} is not aligned to {align}")
            if data_start + offset + n_bytes > size:
                raise r.fail(f"tensor {name} needs bytes up to {data_start + offset + n_bytes}, "
                             f"file has {size}")
    # the declared token count against the embedding/output rows, as llama.cpp's loader checks it
    vocab = check_rows(path.name, meta, {t[0]: t[4][1] for t in tensors if len(t[4]) == 2})
    arch = str(meta.get("general.architecture", ""))
    if arch not in GGUF_ARCHITECTURES:
        raise ModelError(f"{path.name}: unsupported architecture {arch or '(none)'!r}",
                         hint=f"supported GGUF architectures: {', '.join(sorted(GGUF_ARCHITECTURES))}")
    return {"architecture": GGUF_ARCHITECTURES[arch], "gguf_architecture": arch,
            "name": str(meta.get("general.name", "")), "tensors": len(tensors),
            "context_length": int(meta.get(f"{arch}.context_length", 0) or 0),
            "add_bos": bool(meta.get("tokenizer.ggml.add_bos_token", False)), "vocab_size": vocab}


def _metadata(r: _Reader) -> tuple[int, dict[str, Any]]:
    """The tensor count and the metadata key/values, read from just after the version."""
    n_tensors, n_kv = r.scalar("<Q", "tensor count"), r.scalar("<Q", "metadata count")
    # each KV needs >= 12 bytes, each tensor info >= 28: reject absurd counts before looping
    r.need(n_kv * 12 + n_tensors * 28, "metadata/tensor table")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string("metadata key")
        meta[key] = r.value(r.scalar("<I", key), key)
    return n_tensors, meta


def gguf_metadata(path: Path) -> dict[str, Any]:
    """A GGUF file's metadata (scalars and strings; a long array as its length), read with the
    bounds-checked reader above: a fraction of a second where gguf.GGUFReader takes many seconds on
    a 128k-token vocabulary."""
    with Path(path).open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        r = _Reader(mm, Path(path))
        if bytes(mm[:4]) != b"GGUF":
            raise ModelError(f"{Path(path).name} is not a GGUF file (bad magic)")
        r.pos = 8  # magic, version
        return _metadata(r)[1]


def _tensor_info(r: _Reader) -> tuple[str, int, int, int, list[int]]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    name = r.string("tensor name")
    n_dims = r.scalar("<I", f"tensor {name} rank")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise r.fail(f"tensor {name} has rank {n_dims}")
    dims = [r.scalar("<Q", f"tensor {name} shape") for _ in range(n_dims)]
    ggml_type = r.scalar("<I", f"tensor {name} type")
    offset = r.scalar("<Q", f"tensor {name} offset")
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise r.fail(f"tensor {name} has unknown type {ggml_type}") from None
    count = 1
    for d in dims:
        count *= d
    if dims[0] % block:
        raise r.fail(f"tensor {name} row of {dims[0]} is not a multiple of its block size {block}")
    return name, ggml_type, count // block * type_size, offset, dims


# ---- Hugging Face directories -------------------------------------------------

def builder_architectures() -> frozenset[str]:
    """Architectures onnxruntime_genai.models.builder exports, read from its source (no import)."""
    spec = importlib.util.find_spec("onnxruntime_genai")
    if spec is None or not spec.submodule_search_locations:
        return _FALLBACK_BUILDER_ARCHS
    src = Path(next(iter(spec.submodule_search_locations))) / "models" / "builder.py"
    try:
        found = set(re.findall(r'architectures\[0\] == "(\w+)"', src.read_text(encoding="utf-8")))
    except OSError:
        return _FALLBACK_BUILDER_ARCHS
    return frozenset(found) or _FALLBACK_BUILDER_ARCHS


def check_hf_dir(path: Path) -> dict[str, Any]:
    """A Hugging Face causal-LM directory the builder can convert; returns its facts."""
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{path} has no config.json: not a Hugging Face model directory",
                         hint="import takes a .gguf file, a Hugging Face or an ONNX GenAI directory")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ModelError(f"{cfg_path} is not valid JSON: {exc}", hint="fix or re-copy config.json") from None
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else ""
    if arch not in builder_architectures():
        raise ModelError(f"{path.name}: unsupported architecture {arch or '(none in config.json)'!r}",
                         hint="the ONNX Runtime GenAI builder exports e.g. LlamaForCausalLM, "
                              "Qwen2ForCausalLM, Phi3ForCausalLM, MistralForCausalLM, Gemma2ForCausalLM")
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        raise ModelError(f"{path} has no weights (*.safetensors)", hint="copy the model's weight files too")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise ModelError(f"{path} has no tokenizer.json", hint="copy the model's tokenizer files too")
    return {"architecture": arch, "context_length": int(cfg.get("max_position_embeddings", 0) or 0)}


# ---- ONNX GenAI directories ---------------------------------------------------

def _inside(root: Path, target: Path) -> bool:
    try:
        target.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def check_onnx_dir(path: Path) -> dict[str, Any]:
    """Validate an ONNX GenAI directory; returns architecture, context, precision, device."""
    path = Path(path)
    if not path.is_dir():
        raise ModelError(f"model directory {path} does not exist", hint="check the path")
    gc = path / "genai_config.json"
    if not gc.is_file():
        raise ModelError(f"{path} has no genai_config.json: not an ONNX GenAI model directory",
                         hint="build one with `ortserve models import HF_DIR`, or import the GGUF/HF source")
    try:
        model_cfg = json.loads(gc.read_text(encoding="utf-8"))["model"]
        decoder = model_cfg["decoder"]
    except (ValueError, KeyError, TypeError):
        raise ModelError(f"{gc} is not a valid genai_config.json (no model.decoder)",
                         hint="re-export the model with onnxruntime_genai.models.builder") from None
    onnx_name = str(decoder.get("filename", "model.onnx"))
    onnx_file = path / onnx_name
    if Path(onnx_name).is_absolute() or not _inside(path, onnx_file):
        raise ModelError(f"genai_config.json names {onnx_name!r}, outside the model directory",
                         hint="refusing a model whose files live outside its directory")
    if not onnx_file.is_file():
        raise ModelError(f"{path} has no {onnx_name} (named by genai_config.json)",
                         hint="copy the ONNX file(s) next to genai_config.json")
    if not (path / "tokenizer.json").is_file():
        raise ModelError(f"{path} has no tokenizer.json", hint="copy the model's tokenizer.json next to it")
    lib = (decoder.get("session_options") or {}).get("custom_ops_library")   # GGUF-native kernels (gguf_native)
    if lib is not None and (not isinstance(lib, str) or Path(lib).is_absolute() or not _inside(path, path / lib)
                            or not (path / lib).is_file()):
        raise ModelError(f"genai_config.json names the custom-op library {lib!r}, which is not a file in the "
                         "model directory", hint="a model's custom-op library must be a file inside its directory")
    for p in path.rglob("*"):
        if p.is_symlink() and not _inside(path, p):
            raise ModelError(f"{p.name} is a link to outside the model directory",
                             hint="copy the real file into the directory")
    precision = "fp32"
    for f in sorted(path.rglob("*.onnx")):
        precision = _merge_precision(precision, check_external_data(f, path))
    provider = _provider(decoder)
    return {"architecture": str(model_cfg.get("type", "")),
            "context_length": int(model_cfg.get("context_length", 0) or 0),
            "precision": precision, "device": provider}


def _provider(decoder: dict[str, Any]) -> str:
    opts = (decoder.get("session_options") or {}).get("provider_options") or []
    names = [k for o in opts if isinstance(o, dict) for k in o]
    for name in names:
        n = name.lower()
        if n in ("cuda", "dml", "webgpu"):
            return n
    return "cpu"


_RANK = {"fp32": 0, "fp16": 1, "int8": 2, "int4": 3}


def _merge_precision(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


def check_external_data(onnx_file: Path, root: Path) -> str:
    """Refuse external-data locations that escape ``root``; return the file's weight precision."""
    try:
        import onnx
    except ImportError as exc:
        raise DependencyMissing("checking an ONNX model needs the onnx package",
                                hint="pip install 'ortserve[convert]'") from exc
    try:
        model = onnx.load(str(onnx_file), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError, ValueError...: all mean unreadable
        raise ModelError(f"{onnx_file.name} is not a readable ONNX file ({type(exc).__name__})",
                         hint="re-copy or re-export the model") from None
    precision = "fp32"
    for tensor in _all_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in tensor.external_data if e.key == "location"), "")
            target = onnx_file.parent / loc
            if not loc or Path(loc).is_absolute() or ".." in Path(loc).parts or not _inside(root, target):
                raise ModelError(f"{onnx_file.name}: tensor {tensor.name!r} reads external data from "
                                 f"{loc!r}, outside the model directory",
                                 hint="refusing it; a model's data files must live in its directory")
            if not target.is_file():
                raise ModelError(f"{onnx_file.name}: external data file {loc!r} is missing",
                                 hint="copy it next to the ONNX file")
        if tensor.data_type == onnx.TensorProto.FLOAT16:
            precision = _merge_precision(precision, "fp16")
    for node in _all_nodes(model.graph):
        if node.op_type == "MatMulNBits":
            bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
            precision = _merge_precision(precision, "int8" if bits == 8 else "int4")
    return precision


def _all_nodes(graph: Any) -> Any:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _all_nodes(attr.g)
            for g in attr.graphs:
                yield from _all_nodes(g)


def _all_tensors(graph: Any) -> Any:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for g in attr.graphs:
                yield from _all_tensors(g)
