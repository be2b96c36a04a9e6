"""Why the descriptor exchange left pidfd_getfd for unix sockets, as a typed fact: which
rank was refused and the kernel's errno name, for the doctor's rules to read instead of
parsing the message."""

from __future__ import annotations

import dataclasses
import errno

__all__ = ["PidfdRefusal", "errno_name_of"]


@dataclasses.dataclass(frozen=True)
class PidfdRefusal:
    """pidfd_getfd (or pidfd_open) refused on world rank ``rank``: ``errno`` is the
    kernel's name for the refusal (``EPERM``, ``ENOSYS``...) or None when the failure was
    no system call's; ``message`` is that rank's error message."""

    rank: int
    errno: str | None
    message: str


def errno_name_of(error: BaseException) -> str | None:
    """The errno name of the OSError that caused ``error`` (itself or along its causes),
    or None when no system call failed."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return errno.errorcode.get(seen.errno, str(seen.errno))
        seen = seen.__cause__
    return None
