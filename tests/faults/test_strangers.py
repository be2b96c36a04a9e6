"""Attacks on the descriptor sockets from outside the job, with real jobs.

Another local user swapping the job's socket folder in a shared folder, and a stranger's
bytes at a rank's socket while the ranks sit in separate PID namespaces (where a
stranger's pid cannot be told from a rank's). Before: the other user received both ranks'
memfds and wrote into the job's memory; the stranger's 3 bytes ended the job on every
rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ..launchers import mpich_launcher
from ..local_users import SECOND_USER_REASON, second_local_user

HYDRA = mpich_launcher("mpiexec")
HERE = Path(__file__).parent
needs_hydra = pytest.mark.skipif(HYDRA is None, reason="needs mpiexec (pip install mpich)")


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.fixture
def shared_folder():
    """A folder like ``mkdir -m 0777 /tmp/x/shared``, short enough for socket paths, that
    the second user can reach."""
    outer = tempfile.mkdtemp(prefix="sf-", dir="/tmp")
    os.chmod(outer, 0o755)
    shared = Path(outer, "shared")
    shared.mkdir()
    shared.chmod(0o777)
    yield shared
    shutil.rmtree(outer)  # made by this fixture


@needs_hydra
@pytest.mark.skipif(second_local_user() is None, reason=SECOND_USER_REASON)
@pytest.mark.parametrize("sticky", [False, True])
def test_another_user_cannot_swap_the_socket_folder(shared_folder, sticky):
    uid, gid = second_local_user()
    if sticky:
        shared_folder.chmod(0o1777)
    thief = subprocess.Popen([sys.executable, str(HERE / "socket_thief.py"), str(uid),
                              str(gid), str(shared_folder), "8"], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert thief.stdout.readline().strip() == "ready"
        env = dict(os.environ, IPCSHARE_SOCKET_DIR=str(shared_folder))
        out = subprocess.run([HYDRA, "-n", "2", sys.executable, "-m", "ipcshare", "ring",
                              "-b", "1K", "-e", "4K", "--backend", "host", "--exchange",
                              "socket"], capture_output=True, text=True, timeout=60, env=env)
        thief.terminate()   # the job is over: the thief takes what waits for it and says
        said, _ = thief.communicate(timeout=30)
    finally:
        thief.kill()
        thief.wait()
    assert said.strip().endswith("stolen 0"), said
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    if sticky:  # others may not rename what is ours there: the job runs
        assert out.returncode == 0, out.stderr
        assert said.strip() == "renamed 0 stolen 0"
    else:  # refused before anything is made there, on every rank, naming folder and fix
        assert out.returncode == 1 and len(errors) == 2, out.stderr
        for line in errors:
            assert f"IPCSHARE_SOCKET_DIR='{shared_folder}' is writable by other users and " \
                   "not sticky" in line and "chmod +t" in line, line
    assert [p.name for p in shared_folder.iterdir()] == []


@needs_hydra
@pytest.mark.parametrize("what", ["garbage", "header", "silent"])
@pytest.mark.parametrize("namespaces", [
    False, pytest.param(True, marks=pytest.mark.skipif(
        not _unshare_works(), reason="needs unshare -p --mount-proc (root or user namespaces)"))])
def test_a_strangers_bytes_never_end_the_job(socket_base, what, namespaces):
    wrapper = ["unshare", "-p", "-f", "--mount-proc"] if namespaces else []
    env = dict(os.environ, IPCSHARE_SOCKET_DIR=str(socket_base))
    out = subprocess.run([HYDRA, "-n", "2", *wrapper, sys.executable,
                          str(HERE / "stranger_job.py"), what], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "RANK 0 ok refused=0" in out.stdout and "RANK 1 ok refused=1" in out.stdout, \
        out.stdout + out.stderr
    # Refused and logged once, by the rank it knocked on.
    assert out.stderr.count("refused a descriptor-socket connection") == 1, out.stderr
    assert list(socket_base.iterdir()) == []
