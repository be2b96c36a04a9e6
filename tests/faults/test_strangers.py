"""Attacks on the descriptor sockets from outside the job, with real jobs.

Another local user swapping the job's socket folder in a shared folder, and a stranger's
bytes at a rank's socket while the ranks sit in separate PID namespaces (where a
stranger's pid cannot be told from a rank's). Before: the other user received both ranks'
memfds and wrote into the job's memory; the stranger's 3 bytes ended the job on every
rank.
"""

from __future__ import annotations

import os
import re
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


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


NEEDS_UNSHARE = "needs unshare -p --mount-proc (root or user namespaces)"
needs_unshare = pytest.mark.skipif(not unshare_works(), reason=NEEDS_UNSHARE)


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
        not unshare_works(), reason="needs unshare -p --mount-proc (root or user namespaces)"))])
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


@needs_hydra
@needs_unshare
@pytest.mark.parametrize("what", ["hold", "replay"])
def test_a_silent_or_replaying_stranger_in_another_pid_namespace_only_delays(socket_base,
                                                                               what):
    """A connection that stays silent through the exchange, and a header rank 0 really
    sent rank 1 in the first window replayed in the next, from a process in a PID
    namespace of its own. Before: the silent one ended the job (rank 1 read it alone,
    with the whole exchange timeout: ``sending a descriptor to local rank 1 timed out``),
    and the replay was answered and then ended the job."""
    env = dict(os.environ, IPCSHARE_SOCKET_DIR=str(socket_base), IPCSHARE_EXCHANGE_TIMEOUT="3",
               IPCSHARE_STRANGER_UNSHARE="1")
    out = subprocess.run([HYDRA, "-n", "2", "unshare", "-p", "-f", "--mount-proc",
                          sys.executable, str(HERE / "stranger_job.py"), what, "20"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "RANK 0 ok refused=0" in out.stdout and "RANK 1 ok refused=1" in out.stdout, \
        out.stdout + out.stderr
    if what == "replay":  # not one byte of an answer
        assert "answered 0" in out.stdout, out.stdout
    assert out.stderr.count("refused a descriptor-socket connection") == 1, out.stderr
    assert list(socket_base.iterdir()) == []


@needs_hydra
@needs_unshare
@pytest.mark.parametrize("ranks", [3])  # 2 and 3, 20 jobs each: tools/checks/socket_attacks.py
def test_a_relay_in_another_pid_namespace_gets_no_descriptor(socket_base, ranks):
    """A process of the job's user in a PID namespace of its own renames every rank's
    socket away, binds its own under the name and relays each handshake to the real
    rank. Before: the real rank answered the relayed challenge and the senders handed the
    relay their memfds (it wrote into the job's memory; the CLI job even exited 0)."""
    env = dict(os.environ, IPCSHARE_SOCKET_DIR=str(socket_base), IPCSHARE_EXCHANGE_TIMEOUT="3")
    out = subprocess.run([HYDRA, "-n", str(ranks), "unshare", "-p", "-f", "--mount-proc",
                          sys.executable, str(HERE / "relay_job.py"), "3"],
                         capture_output=True, text=True, timeout=60, env=env)
    said = out.stdout + out.stderr
    assert f"swapped {ranks} stolen 0" in out.stdout, said
    assert "OWNED" not in said
    # The senders refuse the replaced sockets: every rank fails together, by name.
    # (The launcher may join the ranks' lines: each is found by its own words.)
    failed = re.findall(r"RANK (\d+) failed: (ExchangeError: .*?\(reported by ranks [^)]*\))",
                        out.stdout)
    assert sorted(int(rank) for rank, _error in failed) == list(range(ranks)), said
    for _rank, error in failed:
        assert "is not the one that rank announced" in error \
            and "it was replaced; no descriptor sent to it" in error, error
