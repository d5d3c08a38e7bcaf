"""The builder child's platform parts: the Windows kill-on-close job (ortserve.models.winjob), what can be checked off Windows, and how a failed builder is reported.

The structure layouts against the 64-bit Windows ABI (sizes and offsets from the SDK headers),
the call sequence against a recording kernel32, and that the path is taken only on win32.
"""

from __future__ import annotations

import ctypes
import sys
from types import SimpleNamespace

import pytest

from ortserve.models import convert, winjob

pytestmark = pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="layouts checked for 64-bit")


def test_structures_match_the_64_bit_windows_abi() -> None:
    basic, ext = winjob.JOBOBJECT_BASIC_LIMIT_INFORMATION, winjob.JOBOBJECT_EXTENDED_LIMIT_INFORMATION
    assert ctypes.sizeof(basic) == 64
    assert ctypes.sizeof(winjob.IO_COUNTERS) == 48
    assert ctypes.sizeof(ext) == 144
    offsets = {name: getattr(basic, name).offset for name, _ in basic._fields_}
    assert offsets == {"PerProcessUserTimeLimit": 0, "PerJobUserTimeLimit": 8, "LimitFlags": 16,
                       "MinimumWorkingSetSize": 24, "MaximumWorkingSetSize": 32, "ActiveProcessLimit": 40,
                       "Affinity": 48, "PriorityClass": 56, "SchedulingClass": 60}
    assert (ext.IoInfo.offset, ext.ProcessMemoryLimit.offset, ext.PeakJobMemoryUsed.offset) == (64, 112, 136)
    assert winjob.kill_on_close_limits().BasicLimitInformation.LimitFlags == 0x2000


def recording_kernel32(assign_ok: int = 1) -> tuple[SimpleNamespace, list[tuple]]:
    calls: list[tuple] = []

    def create(attrs, name):
        calls.append(("CreateJobObjectW", attrs, name))
        return 0x1234

    def set_info(job, klass, info_ref, size):
        info = info_ref._obj
        calls.append(("SetInformationJobObject", job.value, klass, info.BasicLimitInformation.LimitFlags, size))
        return 1

    def assign(job, proc):
        calls.append(("AssignProcessToJobObject", job.value, proc.value))
        return assign_ok

    def close(handle):
        calls.append(("CloseHandle", handle))
        return 1

    return SimpleNamespace(CreateJobObjectW=create, SetInformationJobObject=set_info,
                           AssignProcessToJobObject=assign, CloseHandle=close), calls


def test_on_win32_the_child_goes_into_a_kill_on_close_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    k32, calls = recording_kernel32()
    job = winjob.kill_with_parent(0x88, kernel32=k32)
    assert job is not None and job.handle == 0x1234
    assert calls == [("CreateJobObjectW", None, None),
                     ("SetInformationJobObject", 0x1234, 9, 0x2000, 144),
                     ("AssignProcessToJobObject", 0x1234, 0x88)]
    job.close()
    job.close()  # closing twice closes once
    assert calls[3:] == [("CloseHandle", 0x1234)]


def test_a_failed_assign_names_the_call_and_closes_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    k32, calls = recording_kernel32(assign_ok=0)
    with pytest.raises(OSError, match="AssignProcessToJobObject failed"):
        winjob.kill_with_parent(0x88, kernel32=k32)
    assert calls[-1] == ("CloseHandle", 0x1234)


def test_off_windows_no_job_and_the_builder_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    k32, calls = recording_kernel32()
    assert winjob.kill_with_parent(0x88, kernel32=k32) is None
    assert calls == []

    def no_job(_handle):
        raise AssertionError("kill_with_parent called off Windows")

    monkeypatch.setattr(convert, "kill_with_parent", no_job)
    cmd = [sys.executable, "-c", "import sys; print('built é'); print('warn', file=sys.stderr); sys.exit(3)"]
    proc = convert.run_builder(cmd, env={"PYTHONIOENCODING": "utf-8"})
    assert (proc.returncode, proc.stdout.strip(), proc.stderr.strip()) == (3, "built é", "warn")


def test_a_failed_builder_says_how_it_ended_and_its_last_real_message() -> None:
    assert convert.exit_status(1) == "exit 1"
    assert convert.exit_status(-9) == "killed by SIGKILL"
    err = "Traceback ...\nRuntimeError: bad config\nSaving x:  50%|█████     | 9/18 [00:00<00:00, 242.79it/s]\r\n"
    assert convert.last_message(err) == "RuntimeError: bad config"
    assert convert.last_message("") == "no output"
