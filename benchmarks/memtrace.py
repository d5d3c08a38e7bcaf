r"""What a running server's memory is, from outside: glibc's arenas (``malloc_info``, called in the
process through gdb) and the kernel's split of its resident memory (``/proc/PID/smaps``).

    .venv/bin/python benchmarks/memtrace.py PID            # JSON: arenas, mmapped blocks, smaps split
    .venv/bin/python benchmarks/memtrace.py PID --trim     # the same, then malloc_trim(0), then again

Per arena: the bytes it has from the system, and how much of that is free (``fast``: fastbins,
``rest``: the other free chunks), i.e. what glibc keeps that the program gave back; ``in_use`` is
the difference. Blocks from the mmap threshold up are counted apart (``mmap``). Growth in ``free``
under a steady load is fragmentation, growth in ``in_use`` is live memory (a leak or a cache
filling). Python's own objects are ``ORTSERVE_DEBUG_TRACEMALLOC`` (server/memtrace.py).

gdb stops the process for a few seconds (twice with ``--trim``; it needs ptrace rights: root, or
``kernel.yama.ptrace_scope=0``): clients see it. In a soak on a loaded machine each look cost one
or two requests a transport error (``ReadError``) as the server woke with its keep-alive timers
run out, so a soak that counts errors is looked at this way only when those errors are accepted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from _common import emit
from soak_mix import mem_split


def malloc_info(pid: int, trim: bool = False) -> str:
    """The process's ``malloc_info(0, f)`` XML (after ``malloc_trim(0)`` when ``trim``)."""
    with tempfile.NamedTemporaryFile("r", suffix=".xml", encoding="utf-8") as out:
        cmds = [*(["call (int) malloc_trim(0)"] if trim else []),
                f'set $f = (void*) fopen("{out.name}", "w")', "call (int) malloc_info(0, $f)",
                "call (int) fclose($f)"]
        subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", *(a for c in cmds for a in ("-ex", c))],
                       check=True, capture_output=True, timeout=120)
        return Path(out.name).read_text(encoding="utf-8")


def summarize(xml: str) -> dict[str, Any]:
    """Per arena and in all: MB from the system, MB free inside it, MB in use; mmapped blocks."""
    root = ET.fromstring(xml)

    def mb(node: ET.Element, tag: str, kind: str) -> float:
        el = node.find(f"{tag}[@type='{kind}']")
        return round(int(el.get("size", 0)) / 2**20, 1) if el is not None else 0.0

    arenas = []
    for heap in root.findall("heap"):
        system = mb(heap, "system", "current")
        free = mb(heap, "total", "fast") + mb(heap, "total", "rest")
        arenas.append({"arena": int(heap.get("nr", -1)), "system_mb": system, "free_mb": round(free, 1),
                       "in_use_mb": round(system - free, 1)})
    mmap = root.find("total[@type='mmap']")
    return {"arenas": arenas,
            "system_mb": mb(root, "system", "current"),
            "free_mb": round(mb(root, "total", "fast") + mb(root, "total", "rest"), 1),
            "in_use_mb": round(mb(root, "system", "current") - mb(root, "total", "fast") - mb(root, "total", "rest"), 1),
            "mmap_blocks": int(mmap.get("count", 0)) if mmap is not None else 0,
            "mmap_mb": round(int(mmap.get("size", 0)) / 2**20, 1) if mmap is not None else 0.0}


def look(pid: int, trim: bool = False) -> dict[str, Any]:
    malloc = summarize(malloc_info(pid, trim))   # first: the split below is then after any trim
    anon, file, heap = mem_split(pid)
    return {"smaps": {"anonymous_mb": round(anon, 1), "file_mb": round(file, 1), "heap_mapping_mb": round(heap, 1)},
            "malloc": malloc}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pid", type=int)
    ap.add_argument("--trim", action="store_true", help="also call malloc_trim(0) and look again")
    args = ap.parse_args()
    result = {"before": look(args.pid)}
    if args.trim:
        result["after_trim"] = look(args.pid, trim=True)
    emit(result)


if __name__ == "__main__":
    sys.exit(main())
