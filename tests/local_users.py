"""A second local user for the tests that play another user on the machine."""

from __future__ import annotations

import os
import pwd


def second_local_user() -> tuple[int, int] | None:
    """uid and gid of user ``nobody``, which a test may become (it runs as root); None
    where it cannot (not root, or no such user)."""
    if os.getuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


SECOND_USER_REASON = "needs root, to run a process as a second local user ('nobody')"
