"""Resource counts for leak checks."""

from __future__ import annotations

import os


def open_fd_count() -> int:
    """Descriptors open in this process right now."""
    return len(os.listdir("/proc/self/fd"))


def mapping_count(name: str = "") -> int:
    """Memory mappings of this process right now (only those whose path has ``name``).

    Shared-memory windows show up as ``/memfd:ipcshare``; all mappings also count the
    allocator's arenas, which come and go on their own.
    """
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if name in line)
