"""models/gguf/opening.py: the import's GGUF reader skips long metadata arrays and nothing else.

Compared field by field and tensor by tensor with gguf's own reader: on a written file with long
arrays of every kind next to short ones, and on a real tokenizer file from llama.cpp's source.
"""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from tests.llamacpp import vocab

from ortserve.models.gguf.opening import LONG_ARRAY, open_reader


def _write(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    n = LONG_ARRAY + 7
    w.add_uint32("llama.block_count", 2)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" * (i % 5) for i in range(n)])   # empty strings too
    w.add_array("tokenizer.ggml.scores", [float(i) / 3 for i in range(n)])
    w.add_array("tokenizer.ggml.token_type", [i % 6 for i in range(n)])
    w.add_array("llama.rope.dimension_sections", [16, 24, 24, 0])                  # short: kept whole
    w.add_array("tokenizer.ggml.merges", ["a b", "c d"])
    w.add_float32("llama.rope.freq_base", 500000.0)
    w.add_tensor("token_embd.weight", np.arange(64 * 8, dtype=np.float32).reshape(8, 64))
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _compare(path: Path) -> set[str]:
    plain, light = gguf.GGUFReader(str(path)), open_reader(path)
    assert type(light).__name__ == "LightReader"
    assert list(plain.fields) == list(light.fields)
    skipped = set()
    for key, a in plain.fields.items():
        b = light.fields[key]
        if len(a.data) > LONG_ARRAY:
            assert b.data == [] and b.types == a.types[:2] and b.offset == a.offset, key
            skipped.add(key)
            continue
        assert (b.data, b.types, b.offset) == (a.data, a.types, a.offset), key
        assert all(np.array_equal(x, y) for x, y in zip(a.parts, b.parts, strict=True)), key
    assert light.data_offset == plain.data_offset
    for a, b in zip(plain.tensors, light.tensors, strict=True):
        assert (a.name, a.tensor_type, a.data_offset) == (b.name, b.tensor_type, b.data_offset)
        assert np.array_equal(a.shape, b.shape) and np.array_equal(a.data, b.data)
    return skipped


def test_long_arrays_are_skipped_and_everything_else_is_gguf_s(tmp_path: Path) -> None:
    _write(tmp_path / "t.gguf")
    assert _compare(tmp_path / "t.gguf") == {"tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                              "tokenizer.ggml.token_type"}


def test_a_real_tokenizer_file_reads_the_same() -> None:
    assert _compare(vocab("llama-spm")) == {"tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                             "tokenizer.ggml.token_type"}


def test_an_array_past_the_end_of_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    _write(path)
    data = bytearray(path.read_bytes())
    at = data.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4   # key, value type, item type
    data[at:at + 8] = (10**9).to_bytes(8, "little")   # a billion strings
    path.write_bytes(bytes(data))
    with pytest.raises((ValueError, struct.error)):   # models/validate.py refuses such a file first on import
        open_reader(path)
