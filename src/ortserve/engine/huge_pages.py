"""Transparent huge pages for a model's weights (Linux; issues 22 and 41).

A decode step reads every weight once. In 4 KB pages that is a TLB miss every 4 KB: ~200,000 a
token for a 0.8 GB model. Two kinds of memory hold weights after a session loads:

- anonymous memory ONNX Runtime allocated for prepacked weights (MatMulNBits): advised with
  ``MADV_HUGEPAGE`` and collapsed with ``MADV_COLLAPSE``;
- the file's blocks the GGUF-native ops read in place (docs/native.md). Left to ONNX Runtime they
  would be a private mapping of the external data file: page-cache pages, which THP cannot back.
  ``load_native_weights`` reads them into one anonymous buffer in huge pages instead, and the
  Runner hands them to the session as initializers it uses where they are (no copy).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortserve.native import DOMAIN, GATHER_OP, MATMUL_OP

_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25  # Linux 6.1+: make huge pages of what is already there, now
_THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_enabled() -> bool:
    """Whether this kernel offers transparent huge pages (mode ``always`` or ``madvise``)."""
    try:
        mode = Path(_THP_ENABLED).read_text(encoding="ascii")
    except OSError:  # not Linux, or no THP support
        return False
    return bool(mode) and "[never]" not in mode


def anon_mappings(maps: str | None = None) -> set[tuple[int, int]]:
    """This process's private anonymous read-write mappings (``/proc/self/maps``) as (start, end);
    empty where there is no such file (not Linux)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text(encoding="ascii")
        except OSError:
            return set()
    out = set()
    for line in maps.splitlines():
        parts = line.split()
        # address perms offset dev inode [path]: anonymous = inode 0 and no path (or the brk heap)
        if len(parts) < 5 or parts[1] != "rw-p" or parts[4] != "0" or parts[5:] not in ([], ["[heap]"]):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        out.add((start, end))
    return out


def huge_page_bytes() -> int:
    """Bytes of this process's anonymous memory in transparent huge pages (0 where unknown)."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text(encoding="ascii").splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def use_huge_pages(before: set[tuple[int, int]], min_bytes: int = 4 << 20) -> int:
    """Back the large anonymous mappings made since ``before`` with transparent huge pages.

    Called right after a session loads: those mappings hold the weights ONNX Runtime prepacked
    (~110 MB for the default model), which every decode step reads end to end. glibc's malloc
    gives them 4 KB pages unless the system's THP mode is ``always``, so a step pays a TLB miss
    every 4 KB; in 2 MB pages a greedy step took ~15% less time (docs/bench.md, issue 22).
    ``MADV_HUGEPAGE`` marks them, ``MADV_COLLAPSE`` (Linux 6.1+) converts the pages already
    there. Returns the bytes advised (0: not Linux, THP off, or nothing new).
    """
    madvise = _madvise() if thp_enabled() else None
    if madvise is None:
        return 0
    advised = 0
    for start, end in new_ranges(before, anon_mappings()):
        if end - start < min_bytes:
            continue
        if madvise(start, end - start, _MADV_HUGEPAGE) == 0:
            advised += end - start
            madvise(start, end - start, _MADV_COLLAPSE)  # best effort: older kernels say EINVAL
    return advised


def file_mappings(folder: Path, maps: str | None = None) -> list[tuple[int, int]]:
    """This process's private read-write mappings of files inside ``folder`` (``/proc/self/maps``)
    as (start, end), libraries left out: where onnxruntime maps a model's external data."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
    prefix = str(Path(folder).resolve()) + os.sep
    out = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[1] == "rw-p" and parts[5].startswith(prefix) and not parts[5].endswith(".so"):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end))
    return out


def new_ranges(before: set[tuple[int, int]], after: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The address ranges of ``after`` that no mapping of ``before`` covered. The kernel merges
    adjacent anonymous mappings, so a new one may have grown an old one (another session's
    weights): only the new part is returned."""
    old = sorted(before)
    out = []
    for start, end in sorted(after):
        pos = start
        for a, b in old:
            if b <= pos or a >= end:
                continue
            if a > pos:
                out.append((pos, a))
            pos = max(pos, b)
        if pos < end:
            out.append((pos, end))
    return out


_HUGE = 2 << 20
_WEIGHT_INPUT = {MATMUL_OP: 1, GATHER_OP: 0}  # which input of each op is the file's rows


@dataclass
class NativeWeights:
    """The GGUF-native ops' weights in one anonymous buffer: names and OrtValues for
    ``SessionOptions.add_initializer`` (which does not copy), and the buffer they view."""

    names: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    buffer: Any = None
    nbytes: int = 0


def native_weight_names(graph: Any) -> list[str]:
    """The initializers the GGUF-native ops read as their rows (each once: a tied LM head and the
    embedding share one), in graph order."""
    out: dict[str, None] = {}
    for node in graph.node:
        if node.domain == DOMAIN and node.op_type in _WEIGHT_INPUT and len(node.input) > _WEIGHT_INPUT[node.op_type]:
            out[node.input[_WEIGHT_INPUT[node.op_type]]] = None
    return list(out)


def load_native_weights(proto: Any, folder: Path) -> NativeWeights | None:
    """Read the external-data initializers the GGUF-native ops read into one anonymous buffer
    advised ``MADV_HUGEPAGE`` before it is touched, so its pages are 2 MB from the start (THP mode
    ``madvise`` or ``always``). None where there is nothing to do: not Linux, THP off, no native op,
    a tensor stored inside the graph, or a data file outside ``folder`` (onnxruntime's own load
    then reports what is wrong). A data file shorter than the graph says raises OSError."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if not thp_enabled():
        return None
    by_name = {t.name: t for t in proto.graph.initializer}
    folder = Path(folder).resolve()
    plan = []  # (tensor, file, offset, length)
    for name in native_weight_names(proto.graph):
        tensor = by_name.get(name)
        if tensor is None or tensor.data_location != TensorProto.EXTERNAL:
            return None
        info = {e.key: e.value for e in tensor.external_data}
        path = (folder / info.get("location", "")).resolve()
        if (path.parent != folder and folder not in path.parents) or "length" not in info:
            return None  # outside the folder, or "to the end of the file": onnxruntime's to judge
        plan.append((tensor, path, int(info.get("offset", 0)), int(info["length"])))
    if not plan:
        return None
    plan.sort(key=lambda p: (str(p[1]), p[2]))  # read each file front to back
    starts, total = [], 0
    for _, _, _, length in plan:
        starts.append(total)
        total += -(-length // 64) * 64  # 64-byte aligned, as onnxruntime's own allocations
    buf = mmap.mmap(-1, total + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(buf, dtype=np.uint8)
    shift = -whole.ctypes.data % _HUGE  # 2 MB-aligned, so every 2 MB of it can be one huge page
    madvise = _madvise()
    if madvise is not None:
        madvise(whole.ctypes.data + shift, total, _MADV_HUGEPAGE)
    data = whole[shift:shift + total]
    out = NativeWeights(buffer=(buf, whole), nbytes=total)
    files: dict[Path, Any] = {}
    try:
        for (tensor, path, offset, length), start in zip(plan, starts):
            if path not in files:
                files[path] = path.open("rb")
            f = files[path]
            f.seek(offset)
            view, got = memoryview(data[start:start + length]), 0
            while got < length:
                n = f.readinto(view[got:])
                if not n:
                    raise OSError(f"{path.name} ends before {tensor.name}'s {length} bytes at offset {offset}")
                got += n
            dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
            array = data[start:start + length].view(dtype).reshape(tuple(tensor.dims))
            out.names.append(tensor.name)
            out.values.append(ort.OrtValue.ortvalue_from_numpy(array))
    finally:
        for f in files.values():
            f.close()
    return out


def hand_native_weights(session_options: Any, proto: Any, folder: Path) -> NativeWeights | None:
    """``load_native_weights`` and add them to ``session_options`` (which then belongs to the one
    session made with it: the names are the graph's). None, and nothing added, where there is
    nothing to do or ``proto`` is None (no onnx package)."""
    weights = load_native_weights(proto, folder) if proto is not None else None
    for name, value in zip(weights.names, weights.values) if weights else ():
        session_options.add_initializer(name, value)
    return weights


def _madvise() -> Any:
    """libc's ``madvise(addr, length, advice) -> int``, or None where there is none."""
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise
