"""Why the descriptor exchange left pidfd_getfd for unix sockets, as a typed fact: which
rank was refused and the kernel's errno name, for the doctor's rules to read instead of
parsing the message."""

from __future__ import annotations

import dataclasses

__all__ = ["PidfdRefusal"]


@dataclasses.dataclass(frozen=True)
class PidfdRefusal:
    """pidfd_getfd (or pidfd_open) refused on world rank ``rank``: ``errno`` is the
    kernel's name for the refusal (``EPERM``, ``ENOSYS``...) or None when the failure was
    no system call's; ``message`` is that rank's error message."""

    rank: int
    errno: str | None
    message: str
