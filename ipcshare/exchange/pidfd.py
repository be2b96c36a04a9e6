"""Fetch a peer's descriptor with pidfd_open + pidfd_getfd (Linux >= 5.6)."""

from __future__ import annotations

import ctypes
import errno
import os

from ..runtime.errors import ExchangeError
from ..runtime.owned_fd import OwnedFd

__all__ = ["pidfd_getfd", "fetch_fd", "probe_self", "PIDFD_GETFD_SYSCALL"]

# pidfd_getfd has the same number on every Linux architecture (unified syscall table).
PIDFD_GETFD_SYSCALL = 438

_libc = None


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def pidfd_getfd(pidfd: int, target_fd: int) -> int:
    """Duplicate ``target_fd`` of the process behind ``pidfd`` into this process.

    Raises:
        OSError: with the kernel's errno (EPERM under ptrace/seccomp policy, ENOSYS...).
    """
    result = _syscall()(PIDFD_GETFD_SYSCALL, ctypes.c_int(pidfd), ctypes.c_int(target_fd),
                        ctypes.c_uint(0))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)


def fetch_fd(pid: int, target_fd: int) -> OwnedFd:
    """Take a copy of descriptor ``target_fd`` from process ``pid``.

    Raises:
        ExchangeError: naming the failing call and the errno, with the likely cause.
    """
    if not hasattr(os, "pidfd_open"):
        raise ExchangeError("pidfd_open is not available in this Python/kernel")
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        hint = (" (is the peer in another PID namespace?)" if exc.errno == errno.ESRCH else
                " (raise the descriptor limit: ulimit -n)" if exc.errno == errno.EMFILE else "")
        raise ExchangeError(
            f"pidfd_open({pid}) -> {errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
            + hint) from exc
    try:
        return OwnedFd(pidfd_getfd(pidfd, target_fd))
    except OSError as exc:
        hint = {
            errno.EPERM: "ptrace policy (yama ptrace_scope) or seccomp refuses it",
            errno.ENOSYS: "the kernel or a seccomp filter does not offer pidfd_getfd",
            errno.EBADF: "the peer no longer holds that descriptor",
        }.get(exc.errno, "")
        raise ExchangeError(
            f"pidfd_getfd(pid {pid}, fd {target_fd}) -> "
            f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
            + (f" ({hint})" if hint else "")) from exc
    finally:
        os.close(pidfd)


def probe_self() -> str | None:
    """None when this process may pidfd_getfd from itself, else ``"EPERM: pidfd_getfd
    refused"`` and the like.

    A seccomp filter or a kernel without the call refuses even this; ptrace policy does
    not (a process may always reach itself), so peers can still be refused.
    """
    if not hasattr(os, "pidfd_open"):
        return "unavailable: no os.pidfd_open in this Python"
    try:
        pidfd = os.pidfd_open(os.getpid())
    except OSError as exc:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: pidfd_open refused"
    try:
        os.close(pidfd_getfd(pidfd, pidfd))
        return None
    except OSError as exc:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: pidfd_getfd refused"
    finally:
        os.close(pidfd)
