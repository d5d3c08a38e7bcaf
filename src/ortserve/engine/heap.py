"""The process heap: make a long-running server's RSS follow what it really holds (glibc)."""

from __future__ import annotations

import ctypes
import os
import sys

# glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
HEAP_ARENAS = 2                  # malloc arenas for the whole process
HEAP_MMAP_THRESHOLD = 256 << 10  # allocations from this size up get their own mapping


def tune_heap() -> bool:
    """Make a long-running server's RSS follow what it really holds (Linux/glibc; call it before
    the model loads, so threads created later share the few arenas).

    * Few arenas: glibc gives threads up to 8 x cores arenas of 64 MB; the engine thread, ONNX
      Runtime's workers and the event loop each fragment their own, and a soak's RSS crept up
      for minutes as each reached its own high-water mark (16 streams: a 590 MB plateau with
      6 arenas, 460 MB with 2, measured with benchmarks/soak.py).
    * A fixed mmap threshold: glibc raises its threshold to the largest block ever freed (up
      to 32 MB), after which KV buffers and other large arrays come from the heap and stay there
      when freed. Fixed at 256 KB, they are mapped and unmapped (a decode step allocates nothing
      that large; the KV cache and ONNX Runtime's arena are allocated rarely).

    A user's own ``MALLOC_ARENA_MAX`` / ``MALLOC_MMAP_THRESHOLD_`` win. Returns whether it applied.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        done = False
        if "MALLOC_ARENA_MAX" not in os.environ:
            done = bool(libc.mallopt(_M_ARENA_MAX, HEAP_ARENAS)) or done
        if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            done = bool(libc.mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)) or done
        return done
    except (OSError, AttributeError):  # not glibc (musl): nothing to tune
        return False


def trim_heap() -> None:
    """Ask glibc to return freed heap pages to the system (numpy buffers under the mmap threshold
    stay in the heap otherwise, and RSS never comes down)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
