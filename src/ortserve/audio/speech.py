"""Speech synthesized with espeak-ng, for the import's quality check, the tests and the benchmark.

espeak-ng is a Debian package (``apt-get install espeak-ng``), not a Python one: where it is
missing, ``espeak()`` is None and callers say so instead of measuring.
"""

from __future__ import annotations

import shutil
import subprocess
from importlib import resources
from pathlib import Path


def espeak() -> str | None:
    return shutil.which("espeak-ng")


def phrases() -> list[str]:
    text = resources.files("ortserve.data").joinpath("speech_phrases.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def synthesize(text: str, out: Path, *, voice: str = "en", speed: int = 160) -> Path:
    """Write ``text`` spoken by espeak-ng to ``out`` (a 22.05 kHz WAV)."""
    exe = espeak()
    if exe is None:
        raise FileNotFoundError("espeak-ng is not installed (Debian: apt-get install espeak-ng)")
    subprocess.run([exe, "-v", voice, "-s", str(speed), "-w", str(out), text], check=True,
                   capture_output=True, timeout=120)
    return out
