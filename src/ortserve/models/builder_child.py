"""Runs the ONNX GenAI model builder as a child that dies with its parent, on every platform.

`python -m ortserve.models.builder_child PARENT_PID <builder args...>`. This replaces a
`preexec_fn` (absent on Windows, unsafe with threads): the child arms its own parent-death
signal on Linux, and on every platform a watchdog thread exits when the parent is gone, so a
killed `ortserve models import` never leaves a converter running.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading

import psutil

BUILDER = "onnxruntime_genai.models.builder"


def parent_alive(parent_pid: int) -> bool:
    if os.name == "posix":
        return os.getppid() == parent_pid  # reparented to init/subreaper once the parent dies
    return psutil.pid_exists(parent_pid)


def watch_parent(parent_pid: int, interval: float = 0.5) -> threading.Thread:
    def loop() -> None:
        while parent_alive(parent_pid):
            threading.Event().wait(interval)
        os._exit(137)

    t = threading.Thread(target=loop, name="parent-watchdog", daemon=True)
    t.start()
    return t


def _arm_pdeathsig() -> None:
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main(argv: list[str]) -> None:
    parent_pid = int(argv[0])
    _arm_pdeathsig()
    if not parent_alive(parent_pid):  # the parent died before the signal was armed
        os._exit(137)
    watch_parent(parent_pid)
    sys.argv = [BUILDER, *argv[1:]]
    runpy.run_module(BUILDER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
