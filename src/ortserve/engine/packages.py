"""Which ONNX Runtime distributions are installed, and whether they clash.

onnxruntime, onnxruntime-gpu and onnxruntime-directml all install the same module,
``onnxruntime``; onnxruntime-genai, -cuda and -directml all install ``onnxruntime_genai``.
pip treats them as unrelated projects, so installing a GPU build beside the CPU one leaves
whichever unpacked last in charge of the shared files, often a mix of both. ortserve
therefore depends on none of them directly: each target is an extra (``ortserve[cpu]``,
``ortserve[cuda]``, ``ortserve[directml]``) that pulls exactly one pair, as rembg does with
``rembg[cpu]`` / ``rembg[gpu]``. This module spots the broken states that remain possible
(two of a family, or a GenAI build paired with the wrong runtime) and writes the one
command that repairs each.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass, field

# distribution -> the target it serves
RUNTIMES = {"onnxruntime": "cpu", "onnxruntime-gpu": "cuda", "onnxruntime-directml": "directml",
            "onnxruntime-openvino": "openvino", "onnxruntime-qnn": "qnn", "onnxruntime-rocm": "rocm"}
GENAI = {"onnxruntime-genai": "cpu", "onnxruntime-genai-cuda": "cuda",
         "onnxruntime-genai-directml": "directml", "onnxruntime-genai-rocm": "rocm"}
# the runtime each GenAI build is compiled against
GENAI_RUNTIME = {"onnxruntime-genai": "onnxruntime", "onnxruntime-genai-cuda": "onnxruntime-gpu",
                 "onnxruntime-genai-directml": "onnxruntime-directml",
                 "onnxruntime-genai-rocm": "onnxruntime-rocm"}
_PREFERENCE = ("cuda", "directml", "rocm", "openvino", "qnn", "cpu")


@dataclass
class InstallReport:
    runtimes: list[str] = field(default_factory=list)
    genai: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    target: str | None = None
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "runtimes": self.runtimes, "genai": self.genai, "target": self.target,
                "problems": self.problems, "fix": self.fix}


def installed_distributions() -> list[str]:
    names = set()
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in RUNTIMES or name in GENAI:
            names.add(name)
    return sorted(names)


def check_install(names: Iterable[str] | None = None) -> InstallReport:
    """Inspect the installed distributions (or ``names``, for tests) for clashes."""
    names = sorted(installed_distributions() if names is None else {n.lower() for n in names})
    rep = InstallReport(runtimes=[n for n in names if n in RUNTIMES], genai=[n for n in names if n in GENAI])
    targets = {RUNTIMES[n] for n in rep.runtimes} | {GENAI[n] for n in rep.genai}
    rep.target = next((t for t in _PREFERENCE if t in targets), None)
    if not rep.runtimes:
        rep.problems.append("no onnxruntime distribution is installed")
    if not rep.genai:
        rep.problems.append("no onnxruntime-genai distribution is installed")
    if len(rep.runtimes) > 1:
        rep.problems.append(f"{' and '.join(rep.runtimes)} are installed together; they "
                            "share the module 'onnxruntime', so whichever unpacked last wins")
    if len(rep.genai) > 1:
        rep.problems.append(f"{' and '.join(rep.genai)} are installed together; they "
                            "share the module 'onnxruntime_genai', so whichever unpacked last wins")
    for g in rep.genai:
        want = GENAI_RUNTIME[g]
        if rep.runtimes and want not in rep.runtimes:
            rep.problems.append(f"{g} is built against {want}, which is not installed "
                                f"(found {', '.join(rep.runtimes)})")
    if rep.problems:
        rep.fix = fix_command(rep.target or "cpu", rep.runtimes + rep.genai)
    return rep


def fix_command(target: str, installed: list[str]) -> str:
    """One shell line that leaves exactly one runtime and one GenAI build, for ``target``."""
    genai = next((g for g, t in GENAI.items() if t == target), "onnxruntime-genai")
    install = f"python -m pip install {genai} {GENAI_RUNTIME[genai]}"
    # uninstall first: a plain install over the clash keeps the other build's leftover files
    return f"python -m pip uninstall -y {' '.join(installed)} && {install}" if installed else install
