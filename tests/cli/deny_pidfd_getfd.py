"""Run a command under a seccomp filter that makes pidfd_getfd (syscall 438) fail with
EPERM, as a container's seccomp profile does; everything else is allowed.

    python tests/cli/deny_pidfd_getfd.py mpiexec -n 2 python -m ipcshare doctor --quick

The filter is inherited by every process the command starts (mpiexec, its proxies, the
ranks). Exits with status 77 and a reason when the filter cannot be installed here.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
PIDFD_GETFD = 438
EPERM = 1
# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
BPF_LD_W_ABS = 0x20      # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15         # BPF_JMP | BPF_JEQ | BPF_K
BPF_RET_K = 0x06         # BPF_RET | BPF_K
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
# offsets in struct seccomp_data
NR_OFFSET, ARCH_OFFSET = 0, 4
CANNOT = 77


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def program() -> list[SockFilter]:
    return [
        SockFilter(BPF_LD_W_ABS, 0, 0, ARCH_OFFSET),
        SockFilter(BPF_JEQ_K, 0, 3, AUDIT_ARCH_X86_64),   # another ABI: allow
        SockFilter(BPF_LD_W_ABS, 0, 0, NR_OFFSET),
        SockFilter(BPF_JEQ_K, 0, 1, PIDFD_GETFD),
        SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]


def install() -> None:
    if platform.machine() != "x86_64":
        raise OSError(f"the filter is written for x86_64, this is {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    instructions = program()
    table = (SockFilter * len(instructions))(*instructions)
    prog = SockFprog(len(instructions), ctypes.cast(table, ctypes.POINTER(SockFilter)))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} COMMAND [ARG...]")
    try:
        install()
    except OSError as exc:
        sys.stderr.write(f"cannot install a seccomp filter here: {exc}\n")
        sys.exit(CANNOT)
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
