"""Test modules are collected by basename (tests/ has no packages): two files of one name in
unit/ and integration/ break collection of the whole suite, though each directory passes alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_no_two_test_files_share_a_basename() -> None:
    root = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in root.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
