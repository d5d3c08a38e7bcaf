"""Build hook: compiles ortserve's native GGUF kernels (src/ortserve/native/csrc) with the system C
compiler during `pip install`, editable or not. Everything else is in pyproject.toml.

The library has no Python ABI: it is a plain shared object that ONNX Runtime loads. A failed or
impossible compile (no compiler, not Linux) warns and installs anyway; ortserve then runs its
MatMulNBits graphs and `ortserve info` says why (docs/native.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "src" / "ortserve" / "native"


def _native_build():  # the build module, loaded by path: ortserve is not importable yet
    spec = importlib.util.spec_from_file_location("_ortserve_native_build", NATIVE / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


class BuildPyWithNative(build_py):
    def run(self) -> None:
        super().run()
        nb = _native_build()
        # editable installs import from src/, so the library goes beside the sources there
        out = NATIVE if getattr(self, "editable_mode", False) else Path(self.build_lib) / "ortserve" / "native"
        result = nb.build(out, csrc=NATIVE / "csrc", force=not getattr(self, "editable_mode", False),
                          cc=os.environ.get("CC"))
        if result.ok:
            print(f"ortserve native kernels: {result.library} ({result.reason})")
        elif not sys.platform.startswith("linux"):  # expected there: no warning
            print(f"ortserve native kernels {result.reason}")
        else:
            print(f"WARNING: ortserve native kernels {result.reason}; ortserve will use its MatMulNBits "
                  "graphs (docs/native.md)", file=sys.stderr)


# The wheel stays py3-none-any although it carries a Linux shared object: `ortserve bundle` builds
# ortserve's wheel here and installs it on other platforms (Windows, macOS, manylinux tags), where a
# linux_x86_64 tag would refuse it. The library needs only libc and libm, and the loader checks the
# platform and dlopen before using it (native.status() says "not built" elsewhere).
setup(cmdclass={"build_py": BuildPyWithNative})
