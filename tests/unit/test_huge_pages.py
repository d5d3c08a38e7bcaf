"""Transparent huge pages for new anonymous mappings (engine/runtime.py, issue 22): the maps
parser, and the advice applied for real to a fresh private anonymous mapping."""

from __future__ import annotations

import ctypes
import platform
import sys

import pytest

from ortserve.engine.runtime import anon_mappings, huge_page_bytes, new_ranges, thp_enabled, use_huge_pages

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
