"""SCM_RIGHTS sockets: only the job's ranks get in, strangers are refused and logged."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from ipcshare.errors import ExchangeTimeout
from ipcshare.exchange.unix_socket import (
    SUN_PATH_MAX,
    SocketEndpoint,
    make_socket_dir,
    remove_socket_dir,
    socket_path_fits,
)

TOKEN = "0123456789abcdef"

# A process that pushes a memfd holding b"from <name>" to local rank 0's socket.
SENDER = textwrap.dedent("""
    import os, sys
    from ipcshare.exchange.unix_socket import SocketEndpoint
    directory, token, local_rank, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    fd = os.memfd_create("payload")
    os.write(fd, ("from " + name).encode())
    me = SocketEndpoint(token=token, directory=directory or None, local_rank=local_rank,
                        peer_pids=[0, os.getpid()], timeout=5)
    me.send_fd(0, fd, 1)
    me.close()
""")


def _start_sender(directory, local_rank, name, token=TOKEN):
    return subprocess.Popen([sys.executable, "-c", SENDER, directory or "", token,
                             str(local_rank), name])


@pytest.mark.parametrize("abstract", [False, True])
def test_job_peer_gets_through_and_a_stranger_is_refused(caplog, abstract):
    directory = None if abstract else make_socket_dir(TOKEN)
    try:
        receiver = SocketEndpoint(token=TOKEN, directory=directory, local_rank=0,
                                  peer_pids=[os.getpid(), -1], timeout=20)
        # The stranger even knows the token and claims to be local rank 1; its send
        # completes once the kernel queues the connection.
        stranger = _start_sender(directory, 1, "stranger")
        assert stranger.wait(timeout=30) == 0
        legit = _start_sender(directory, 1, "peer")
        receiver.peer_pids[1] = legit.pid  # what MPI told us: this process is local rank 1
        with caplog.at_level(logging.WARNING, logger="ipcshare"):
            got = receiver.receive_fds({1}, sequence=1)
        assert legit.wait(timeout=30) == 0
        assert set(got) == {1}
        with got[1] as fd:
            assert os.pread(fd.fileno(), 100, 0) == b"from peer"
        assert (stranger.pid, os.getuid()) in receiver.refused
        assert f"refused a descriptor-socket connection from pid {stranger.pid}" in caplog.text
        receiver.close()
    finally:
        remove_socket_dir(directory)


def test_missing_peer_times_out_with_its_name(tmp_path):
    directory = make_socket_dir(TOKEN)
    try:
        receiver = SocketEndpoint(token=TOKEN, directory=directory, local_rank=0,
                                  peer_pids=[os.getpid(), 1], timeout=0.3)
        with pytest.raises(ExchangeTimeout, match=r"local rank\(s\) \[1\]"):
            receiver.receive_fds({1}, sequence=1)
        receiver.close()
        assert os.listdir(directory) == []  # the socket file went with close()
    finally:
        remove_socket_dir(directory)
    assert not os.path.exists(directory)


def test_socket_dir_is_private_and_fits_sun_path():
    directory = make_socket_dir(TOKEN)
    try:
        assert os.stat(directory).st_mode & 0o777 == 0o700
        assert socket_path_fits(os.path.join(directory, "r99999.sock"))
    finally:
        remove_socket_dir(directory)


def test_long_socket_dirs_fall_back(monkeypatch, tmp_path):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(deep))
    assert not socket_path_fits(str(deep / "x" / "r0.sock"))
    directory = make_socket_dir(TOKEN)
    try:
        assert directory is None or len(directory) + 12 <= SUN_PATH_MAX
        assert directory is None or not directory.startswith(str(deep))
    finally:
        remove_socket_dir(directory)
