"""A Windows Job Object that kills the model builder when ortserve dies (kill-on-close).

On Windows a child outlives a killed parent, and there is no parent-death signal. The parent
creates a job with JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE and puts the child in it; the only handle
to the job is the parent's, so when the parent exits, however it exits, Windows closes that
handle and terminates every process in the job. Plain ctypes against kernel32, no pywin32.

Import-safe everywhere: the structures are plain ctypes, and kernel32 is looked up only when
`kill_with_parent` runs on win32 (elsewhere it returns None and the builder child's own
parent-death signal and watchdog do the job). Not yet run on Windows (see docs/deploy.md).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS = 9  # JobObjectExtendedLimitInformation

# Windows types by width, so that the layout is the 64-bit ABI's on any 64-bit host:
# LARGE_INTEGER = int64, DWORD = uint32, SIZE_T / ULONG_PTR = pointer-sized, ULONGLONG = uint64.
_LARGE_INTEGER = ctypes.c_int64
_DWORD = ctypes.c_uint32
_SIZE_T = ctypes.c_size_t
_ULONGLONG = ctypes.c_uint64


# The SDK names, field by field (winnt.h), so the layout can be checked against the headers.
class JOBOBJECT_BASIC_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", _LARGE_INTEGER),
        ("PerJobUserTimeLimit", _LARGE_INTEGER),
        ("LimitFlags", _DWORD),
        ("MinimumWorkingSetSize", _SIZE_T),
        ("MaximumWorkingSetSize", _SIZE_T),
        ("ActiveProcessLimit", _DWORD),
        ("Affinity", _SIZE_T),  # ULONG_PTR
        ("PriorityClass", _DWORD),
        ("SchedulingClass", _DWORD),
    ]


class IO_COUNTERS(ctypes.Structure):
    _fields_ = [
        ("ReadOperationCount", _ULONGLONG),
        ("WriteOperationCount", _ULONGLONG),
        ("OtherOperationCount", _ULONGLONG),
        ("ReadTransferCount", _ULONGLONG),
        ("WriteTransferCount", _ULONGLONG),
        ("OtherTransferCount", _ULONGLONG),
    ]


class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
        ("IoInfo", IO_COUNTERS),
        ("ProcessMemoryLimit", _SIZE_T),
        ("JobMemoryLimit", _SIZE_T),
        ("PeakProcessMemoryUsed", _SIZE_T),
        ("PeakJobMemoryUsed", _SIZE_T),
    ]


def kill_on_close_limits() -> JOBOBJECT_EXTENDED_LIMIT_INFORMATION:
    info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
    info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    return info


def _kernel32() -> Any:
    return ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]  # win32 only


class JobHandle:
    """The parent's handle to the job: close it (or die) and every process in the job ends."""

    def __init__(self, kernel32: Any, handle: int) -> None:
        self._k32, self.handle = kernel32, handle

    def close(self) -> None:
        if self.handle:
            self._k32.CloseHandle(self.handle)
            self.handle = 0


def kill_with_parent(process_handle: int, kernel32: Any = None) -> JobHandle | None:
    """Put the process (a Win32 HANDLE, `Popen._handle`) in a new kill-on-close job.

    Returns the job handle the parent must keep open while the child runs, or None on
    platforms other than Windows. Raises OSError naming the failing call on Windows.
    """
    if sys.platform != "win32":
        return None
    k32 = kernel32 or _kernel32()
    k32.CreateJobObjectW.restype = ctypes.c_void_p
    job = k32.CreateJobObjectW(None, None)
    if not job:
        raise _error(k32, "CreateJobObjectW")
    handle = JobHandle(k32, job)
    info = kill_on_close_limits()
    ok = k32.SetInformationJobObject(ctypes.c_void_p(job), JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS,
                                     ctypes.byref(info), ctypes.sizeof(info))
    if not ok:
        handle.close()
        raise _error(k32, "SetInformationJobObject")
    if not k32.AssignProcessToJobObject(ctypes.c_void_p(job), ctypes.c_void_p(int(process_handle))):
        handle.close()
        raise _error(k32, "AssignProcessToJobObject")
    return handle


def _error(kernel32: Any, call: str) -> OSError:
    code = ctypes.get_last_error() if hasattr(ctypes, "get_last_error") else 0
    return OSError(code, f"{call} failed (Windows error {code}): the model builder would outlive a killed ortserve")
