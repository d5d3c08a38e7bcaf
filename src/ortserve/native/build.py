"""Compile the native kernel library: `python -m ortserve.native.build` (docs/native.md).

`pip install` runs the same function (setup.py loads this file by path, before ortserve is
importable, so it imports nothing but the standard library). One shared library from every
`csrc/*.c`, with the system C compiler: no Python ABI, no -march (the kernels pick AVX2 or
AVX-512 VNNI at run time with per-function target attributes). Linux only; elsewhere, or without
a compiler, it reports why and builds nothing, and ortserve runs on the MatMulNBits graphs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

LIBRARY_NAME = "libortserve_gguf.so"
HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
FLAGS = ["-O3", "-fPIC", "-shared", "-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra",
         "-Wno-unused-parameter", "-fno-math-errno"]


@dataclass(frozen=True)
class BuildResult:
    library: Path | None
    reason: str  # what happened, one line: "built", "up to date", or why nothing was built

    @property
    def ok(self) -> bool:
        return self.library is not None


def sources(csrc: Path = CSRC) -> list[Path]:
    return sorted(csrc.glob("*.c"))


def stale(library: Path, csrc: Path = CSRC) -> bool:
    """True when the library is missing or older than any source or header."""
    if not library.is_file():
        return True
    built = library.stat().st_mtime
    return any(p.stat().st_mtime > built for p in [*csrc.glob("*.c"), *csrc.glob("*.h")])


def compiler(cc: str | None = None) -> str | None:
    """The C compiler: the one named (setup.py passes $CC), else sysconfig's, else cc/gcc/clang."""
    names = [cc] if cc else []
    configured = sysconfig.get_config_var("CC")
    if configured:
        names.append(str(configured).split()[0])
    names += ["cc", "gcc", "clang"]
    return next((found for name in names if (found := shutil.which(name))), None)


def build(out_dir: Path = HERE, *, csrc: Path = CSRC, force: bool = False, cc: str | None = None,
          extra_flags: list[str] | None = None) -> BuildResult:
    """Compile csrc/*.c into out_dir/libortserve_gguf.so; never raises for a failed compile."""
    if not sys.platform.startswith("linux"):
        return BuildResult(None, f"not built: the native library builds on Linux only (this is {sys.platform})")
    target = out_dir / LIBRARY_NAME
    if not force and not stale(target, csrc):
        return BuildResult(target, "up to date")
    files = sources(csrc)
    if not files:
        return BuildResult(None, f"not built: no C sources in {csrc}")
    exe = compiler(cc)
    if exe is None:
        return BuildResult(None, "not built: no C compiler found (install gcc or clang, then run "
                                 "`python -m ortserve.native.build`)")
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".tmp")
    cmd = [exe, *FLAGS, *(extra_flags or []), f"-I{csrc}", "-o", str(partial), *map(str, files), "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return BuildResult(None, f"not built: {exe} failed to run: {exc}")
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        return BuildResult(None, f"not built: {Path(exe).name} exited with {proc.returncode}:\n{tail}")
    partial.replace(target)  # atomic: a running process never sees half a library
    return BuildResult(target, "built")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ortserve.native.build",
                                     description="Compile the GGUF kernel library in place.")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the library (default: beside it)")
    args = parser.parse_args(argv)
    result = build(args.out, force=args.force)
    print(f"{result.library or LIBRARY_NAME}: {result.reason}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
