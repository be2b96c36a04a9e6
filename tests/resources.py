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


SHM_DIR = "/dev/shm"


def _shm_in_use() -> set[str]:
    """Names of /dev/shm entries that some live process maps or holds open."""
    used = set()
    prefix = SHM_DIR + "/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                used.update(line.split(prefix, 1)[1].split()[0] for line in maps
                            if prefix in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(prefix):
                    used.add(target[len(prefix):].removesuffix(" (deleted)"))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return used


def idle_shm_entries(*, skip_prefixes: tuple[str, ...] = ("mpich_shm_",)) -> set[str]:
    """/dev/shm entries that no live process maps or holds open, but those whose names
    start with ``skip_prefixes`` (MPICH's own segments: a job SIGKILLed by its launcher
    leaves them whatever anyone does).

    What a finished job left behind is idle; what an MPI job running beside the tests
    (another pytest-xdist worker's, or any other) uses right now is not, so it neither
    hides nor fakes a leak.
    """
    names = os.listdir(SHM_DIR) if os.path.isdir(SHM_DIR) else []
    candidates = {name for name in names if not name.startswith(skip_prefixes)}
    return candidates - _shm_in_use() if candidates else candidates
