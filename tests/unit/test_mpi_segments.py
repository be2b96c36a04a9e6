"""MPI's /dev/shm segments that killed jobs left are removed only when provably unused
(hydra SIGKILLs a whole job, and its 2-3 MiB segments stayed for good)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ipcshare.liveness.mpi_segments import SHM_DIR, remove_stale_mpi_segments

from ..launchers import mpich_launcher

HYDRA = mpich_launcher("mpiexec")
IPCSHARE = [sys.executable, "-m", "ipcshare"]
TWO_DAYS = 2 * 86400
# Rank 1 SIGKILLs itself once MPI is up: hydra then SIGKILLs rank 0, so no rank of the
# job gets to MPI_Finalize.
KILLED_JOB = ("import os, time; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
              "os.kill(os.getpid(), 9) if MPI.COMM_WORLD.rank == 1 else time.sleep(30)")


def _age(path, seconds=TWO_DAYS) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def _segments() -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith("mpich_shm_")}


@pytest.fixture
def shm_like():
    base = tempfile.mkdtemp(prefix="shm-", dir=SHM_DIR if os.path.isdir(SHM_DIR) else None)
    yield Path(base)
    for name in os.listdir(base):
        os.unlink(os.path.join(base, name))
    os.rmdir(base)


def _holder(path: Path, how: str) -> subprocess.Popen:
    """A live process that maps ``path`` (and closes the descriptor) or keeps it open."""
    code = ("import mmap, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
            + ("m = mmap.mmap(fd, 4096); os.close(fd); " if how == "map" else "")
            + "print('ready', flush=True); time.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def test_unused_segments_go_and_every_decoy_stays(shm_like):
    def segment(name: str) -> Path:
        path = shm_like / name
        path.write_bytes(bytes(mmap.PAGESIZE))
        return path

    stale = segment("mpich_shm_1f2e3d4c_0")
    mapped = segment("mpich_shm_aaaa0001_0")
    held_open = segment("mpich_shm_aaaa0002_0")
    young = segment("mpich_shm_aaaa0003_0")
    segment("mpich_shm_notes.txt")  # not MPICH's pattern
    os.symlink(stale, shm_like / "mpich_shm_aaaa0004_0")
    expected_left = ["mpich_shm_aaaa0001_0", "mpich_shm_aaaa0002_0", "mpich_shm_aaaa0003_0",
                     "mpich_shm_notes.txt", "mpich_shm_aaaa0004_0"]
    if os.getuid() == 0:  # only root can give a file to another user
        os.chown(segment("mpich_shm_aaaa0005_0"), 65534, 65534)
        expected_left.append("mpich_shm_aaaa0005_0")
    holders = [_holder(mapped, "map"), _holder(held_open, "open")]
    try:
        for path in shm_like.iterdir():
            if path != young:
                _age(path)
        assert remove_stale_mpi_segments(str(shm_like)) == [str(stale)]
        assert sorted(path.name for path in shm_like.iterdir()) == sorted(expected_left)
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
            holder.stdout.close()
    # Once their holders are gone those two are stale too; the others still stay.
    assert sorted(remove_stale_mpi_segments(str(shm_like))) == [str(mapped), str(held_open)]


@pytest.mark.skipif(HYDRA is None, reason="needs mpiexec (mpich)")
def test_the_next_job_removes_what_a_killed_job_left(socket_base):
    before = _segments()
    killed = subprocess.run([HYDRA, "-n", "2", sys.executable, "-c", KILLED_JOB],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode != 0
    left = _segments() - before
    assert left, "the killed job left no MPICH segment (did MPICH change?)"
    for name in left:
        _age(os.path.join(SHM_DIR, name))
    env = dict(os.environ, IPCSHARE_SOCKET_DIR=str(socket_base))
    out = subprocess.run([HYDRA, "-n", "2", *IPCSHARE, "ring", "-b", "1K", "-e", "1K"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert _segments() & left == set()
