"""Opening a GGUF file for import without parsing its vocabulary.

gguf's ``GGUFReader`` builds a numpy view for every entry of every metadata array: for Gemma 3's
262k-token vocabulary that is ~2 million views, ~10 s on 2 cores and ~1.2 GB of Python objects,
and an exact import opened the file five times. The import never reads those arrays from this
reader (the tokenizer is converted from the file by transformers; the vocabulary checks use
models/validate.py's own reader), so ``open_reader`` skips the long ones: such a field keeps its
type and length parts and has no entries (``field.data == []``). Scalars, strings, short arrays
and the tensor table are gguf's own, unchanged.

If gguf's private parsing method ever changes shape, ``open_reader`` falls back to the plain reader.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import Any

LONG_ARRAY = 4096   # arrays with more entries than this are skipped (vocabularies, merges, scores)


@functools.cache
def _reader_class() -> Any:
    import gguf
    import numpy as np
    from gguf.constants import GGUFValueType

    sizes = {t: np.dtype(d).itemsize for t, d in gguf.GGUFReader.gguf_scalar_to_np.items()}

    class LightReader(gguf.GGUFReader):
        def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
            if GGUFValueType(raw_type) != GGUFValueType.ARRAY or self.byte_order != "I":
                return super()._get_field_parts(orig_offs, raw_type)
            itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
            n, kind = int(alen[0]), GGUFValueType(int(itype[0]))
            if n <= LONG_ARRAY or (kind != GGUFValueType.STRING and kind not in sizes):
                return super()._get_field_parts(orig_offs, raw_type)
            offs = orig_offs + 12
            if kind == GGUFValueType.STRING:   # walk the lengths only
                buf, unpack = memoryview(self.data), struct.Struct("<Q").unpack_from
                for _ in range(n):
                    offs += 8 + unpack(buf, offs)[0]
            else:
                offs += n * sizes[kind]
            if offs > len(self.data):
                raise ValueError(f"metadata array runs past the end of the file ({offs} > {len(self.data)})")
            return offs - orig_offs, [itype, alen], [], [GGUFValueType.ARRAY, kind]

    return LightReader


def open_reader(path: Path | str) -> Any:
    """A ``gguf.GGUFReader`` of ``path`` whose long metadata arrays are skipped (module docstring)."""
    import gguf

    try:
        cls = _reader_class()
    except (AttributeError, ImportError, TypeError):   # gguf changed: the plain reader still works
        return gguf.GGUFReader(str(path))
    return cls(str(path))
