"""The MPI library's shared-memory files in /dev/shm: the job's own at a forced exit, and
those that killed jobs of this user left behind.

MPICH (ch4 shm) and Open MPI (vader) unlink their node segments only in MPI_Finalize. A
rank that leaves without it, or a job whose launcher SIGKILLs every rank (MPICH's hydra
does when one rank dies), leaves them for good: about 2-3 MiB of memory each, until
reboot. Names alone prove nothing, so a segment is removed only when it provably belongs
to this process (``remove_mpi_segments``) or provably belongs to no process at all
(``remove_stale_mpi_segments``). docs/RELIABILITY.md, "What ipcshare deletes".
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import time

from ..runtime.logs import get_logger

__all__ = ["STALE_SEGMENT_AGE_S", "remove_mpi_segments", "remove_stale_mpi_segments"]

log = get_logger("liveness")

SHM_DIR = "/dev/shm"
# A segment is only swept once this old: far beyond the microseconds between its creation
# and its mapping by the rank that made it.
STALE_SEGMENT_AGE_S = 60.0
# The names the MPI libraries give their node segments: MPICH's ch4 shm ("mpich_shm_"
# + a hex key + "_" + a counter) and Open MPI's vader BTL.
_MPICH_SEGMENT = re.compile(r"mpich_shm_[0-9a-f]{1,16}_[0-9]{1,6}")
_MPI_SEGMENT_PREFIXES = ("mpich_shm_", "vader_segment.")
_F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)  # Linux's value, for Pythons without it


def remove_mpi_segments(pid: int | str = "self") -> list[str]:
    """Unlink the MPI library's /dev/shm segments that process ``pid`` maps.

    Only for a process about to leave without MPI_Finalize: the mappings of every process
    stay valid, only the names go. Returns the paths removed.
    """
    removed = []
    try:
        with open(f"/proc/{pid}/maps") as maps:
            # A name another survivor already removed reads "... (deleted)": skip those.
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps
                     if f"{SHM_DIR}/" in line and not line.rstrip().endswith("(deleted)")}
    except OSError:
        return removed
    for path in sorted(paths):
        name = os.path.basename(path)
        if path.startswith(f"{SHM_DIR}/") and name.startswith(_MPI_SEGMENT_PREFIXES):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass  # already gone (another survivor), or not ours to remove
    return removed


def remove_stale_mpi_segments(directory: str = SHM_DIR, *,
                              min_age: float = STALE_SEGMENT_AGE_S) -> list[str]:
    """Unlink MPICH segments that killed jobs of this user left in ``directory``.

    A file is removed only when all of these hold: its name is exactly MPICH's pattern;
    it is a regular file (not a symlink) owned by this user, older than ``min_age``
    seconds; and no process anywhere maps it or holds it open. The kernel proves the last
    one: a write lease (``F_SETLEASE``) is granted only on a file that no other open file
    description refers to, and a mapping keeps its file's description alive. This sees
    processes in every pid namespace, including ones this process cannot list. The name
    is unlinked while the lease is held. Returns the paths removed.
    """
    uid, now = os.getuid(), time.time()
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    removed = []
    for name in names:
        if not _MPICH_SEGMENT.fullmatch(name):
            continue
        path = os.path.join(directory, name)
        try:
            # O_NONBLOCK: a file someone holds a lease on answers at once, never blocks.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # a symlink, gone, or not ours to read
        try:
            info = os.fstat(fd)
            if (not stat.S_ISREG(info.st_mode) or info.st_uid != uid
                    or now - info.st_mtime < min_age):
                continue
            try:
                fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_WRLCK)
            except OSError:
                continue  # mapped or open somewhere (EAGAIN), or leases are disabled
            try:
                current = os.lstat(path)
                if (current.st_dev, current.st_ino) == (info.st_dev, info.st_ino):
                    os.unlink(path)
                    removed.append(path)
                    log.info("removed %s, an MPI segment that a killed job left "
                             "(no process maps or holds it)", path)
            except OSError:
                pass
            finally:
                fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_UNLCK)
        finally:
            os.close(fd)
    return removed
