"""Transparent huge pages for a model's weights (engine/huge_pages.py, issues 22 and 41): the maps
parsers, the advice applied for real to a fresh private anonymous mapping, and a private file
mapping (how onnxruntime maps external data) moved in place into anonymous huge pages."""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from pathlib import Path

import pytest

from ortserve.engine.huge_pages import (
    anon_mappings,
    file_mappings,
    huge_page_bytes,
    load_native_weights,
    native_weight_names,
    new_ranges,
    thp_enabled,
    use_huge_pages,
)

MAPS = """\
55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234  /usr/bin/python3.11
55d0c1e00000-55d0c2400000 rw-p 00000000 00:00 0     [heap]
7f0000000000-7f0008000000 rw-p 00000000 00:00 0
7f0008000000-7f0008400000 rw-s 00000000 00:05 77    /dev/shm/x (deleted)
7f0010000000-7f0010200000 rw-p 00000000 08:01 999   /tmp/model.onnx.data
7f0020000000-7f0020001000 ---p 00000000 00:00 0
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0     [stack]
"""


def test_anon_mappings_keeps_private_anonymous_rw_regions_and_the_heap_only() -> None:
    assert anon_mappings(MAPS) == {(0x55d0c1e00000, 0x55d0c2400000), (0x7f0000000000, 0x7f0008000000)}


def test_file_mappings_keep_private_writable_mappings_of_files_in_the_folder_only() -> None:
    maps = MAPS + ("7f0030000000-7f0034000000 rw-p 00001000 08:01 999   /models/m/model.onnx.data\n"
                   "7f0034000000-7f0034400000 r--p 00000000 08:01 998   /models/m/libortserve_gguf.so\n"
                   "7f0034400000-7f0034800000 rw-p 00000000 08:01 998   /models/m/libortserve_gguf.so\n"
                   "7f0040000000-7f0044000000 rw-p 00000000 08:01 997   /models/mx/model.onnx.data\n")
    assert file_mappings(Path("/models/m"), maps) == [(0x7f0030000000, 0x7f0034000000)]
    assert file_mappings(Path("/tmp"), maps) == [(0x7f0010000000, 0x7f0010200000)]


def test_new_ranges_leave_out_what_was_mapped_before_even_inside_a_merged_mapping() -> None:
    before = {(100, 200), (300, 400), (1000, 1100)}
    # (100, 200) grew on both sides (a merge); (300, 400) split the new one; (500, 600) is new
    after = {(50, 250), (250, 450), (500, 600), (1000, 1100)}
    assert new_ranges(before, after) == [(50, 100), (200, 250), (250, 300), (400, 450), (500, 600)]
    assert new_ranges(before, before) == []


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        got = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return got >= (major, minor)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not thp_enabled(),
                    reason="transparent huge pages are a Linux feature, and off here")
def test_a_new_large_private_mapping_is_advised_and_collapsed_into_huge_pages() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = 32 << 20
    before = anon_mappings()
    huge_before = huge_page_bytes()
    # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS: what malloc does for a large block
    addr = libc.mmap(None, size, 0x1 | 0x2, 0x02 | 0x20, -1, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    try:
        ctypes.memset(addr, 1, size)  # faulted in as 4 KB pages (THP mode "madvise": no advice yet)
        advised = use_huge_pages(before)
        assert advised >= size
        assert use_huge_pages(anon_mappings()) == 0  # nothing new since: nothing advised
        if _kernel_at_least(6, 1):  # MADV_COLLAPSE converts the pages already there
            assert huge_page_bytes() - huge_before >= 16 << 20
        assert ctypes.string_at(addr + size - 4096, 16) == b"\x01" * 16  # the contents survive
    finally:
        libc.munmap(addr, size)


def _native_graph(folder: Path, rows: int, row_bytes: int, location: str = "model.onnx.data") -> tuple[object, bytes]:
    """A graph whose GgufMatMul and GgufGather read one uint8 [rows, row_bytes] initializer kept
    in an external data file (after 4 KB of something else), as the GGUF-native import writes it."""
    from onnx import TensorProto, helper

    data = os.urandom(rows * row_bytes)
    (folder / "model.onnx.data").write_bytes(b"\0" * 4096 + data)
    w = TensorProto(name="w", data_type=TensorProto.UINT8, dims=[rows, row_bytes])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "4096"), ("length", str(len(data)))):
        w.external_data.add(key=key, value=value)
    nodes = [helper.make_node("GgufGather", ["w", "ids"], ["e"], domain="ortserve.gguf"),
             helper.make_node("GgufMatMul", ["e", "w"], ["y"], domain="ortserve.gguf")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w])
    return helper.make_model(graph), data


@pytest.mark.skipif(not sys.platform.startswith("linux") or not thp_enabled(),
                    reason="transparent huge pages are a Linux feature, and off here")
def test_the_native_ops_weights_are_read_once_into_huge_pages_as_the_file_holds_them(tmp_path: Path) -> None:
    rows, row_bytes = 1000, 13 * 1024 + 64  # 13.1 MB: past two whole 2 MB pages wherever it starts
    proto, data = _native_graph(tmp_path, rows, row_bytes)
    assert native_weight_names(proto.graph) == ["w"]  # the gather and the tied head share it: once
    huge_before = huge_page_bytes()
    weights = load_native_weights(proto, tmp_path)
    assert weights is not None and weights.names == ["w"] and weights.nbytes >= len(data)
    got = weights.values[0].numpy()
    assert got.shape == (rows, row_bytes) and got.dtype.name == "uint8"
    assert got.tobytes() == data
    assert huge_page_bytes() - huge_before >= 4 << 20


def test_native_weights_outside_the_folder_inside_the_graph_or_cut_short_are_left_to_onnxruntime(tmp_path: Path) -> None:
    if not thp_enabled():
        pytest.skip("transparent huge pages are off here: nothing is loaded")
    (tmp_path / "m").mkdir()
    proto, _ = _native_graph(tmp_path / "m", 4, 32, location="../model.onnx.data")
    (tmp_path / "model.onnx.data").write_bytes(b"\0" * 8192)
    assert load_native_weights(proto, tmp_path / "m") is None  # a path out of the folder: not read
    proto, _ = _native_graph(tmp_path, 4, 32)
    del proto.graph.initializer[0].external_data[2]  # no length: "to the end of the file"
    assert load_native_weights(proto, tmp_path) is None
    proto, _ = _native_graph(tmp_path, 4, 32)
    proto.graph.initializer[0].data_location = 0  # stored in the graph: nothing to read
    assert load_native_weights(proto, tmp_path) is None
    proto, data = _native_graph(tmp_path, 4, 32)
    (tmp_path / "model.onnx.data").write_bytes(b"\0" * 4096 + data[:-1])
    with pytest.raises(OSError, match="ends before w's 128 bytes at offset 4096"):
        load_native_weights(proto, tmp_path)
