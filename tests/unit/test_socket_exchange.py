"""SCM_RIGHTS sockets: only the job's ranks get in, strangers are refused and logged."""

from __future__ import annotations

import logging
import os
import re
import secrets
import subprocess
import sys
import textwrap
import threading

import pytest

from ipcshare.exchange.socket_dir import (
    CLAIM_NAME,
    SUN_PATH_MAX,
    make_socket_dir,
    remove_socket_dir,
    socket_path_fits,
)
from ipcshare.exchange.unix_socket import SocketEndpoint
from ipcshare.runtime.errors import ExchangeTimeout

# Of this process: the abstract socket names hold it, and two pytest-xdist workers must not
# share them.
TOKEN = secrets.token_hex(8)
SECRET = bytes(range(32))

# A process that pushes a memfd holding b"from <name>" to local rank 0's socket, whose
# listener it expects to be pid LISTENER ("none": a pid it cannot check, which the
# listener must then answer for with the job's secret).
SENDER = textwrap.dedent("""
    import os, sys
    from ipcshare.exchange.unix_socket import SocketEndpoint
    directory, token, local_rank, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    secret = bytes.fromhex(sys.argv[5])
    listener = None if sys.argv[6] == "none" else int(sys.argv[6])
    # What local rank 0 announced over MPI: its socket's st_dev:st_ino ("-" if abstract).
    announced = None if sys.argv[7] == "-" else tuple(map(int, sys.argv[7].split(":")))
    fd = os.memfd_create("payload")
    os.write(fd, ("from " + name).encode())
    me = SocketEndpoint(token=token, secret=secret, directory=directory or None,
                        local_rank=local_rank,
                        peer_pids=[listener, os.getpid()], timeout=5)
    me.announce([announced, me.listening_identity])
    if sys.argv[8] != "-":  # a stranger that read local rank 0's name in /proc/net/unix
        target = sys.argv[8].replace("@", "\\0", 1).encode()
        me.address_of = lambda rank: target if rank == 0 else None
    me.send_fd(0, fd, 1)
    me.close()
""")


def _start_sender(directory, local_rank, name, token=TOKEN, secret=SECRET, wrapper=(),
                  listener="self", announced=None, target=None, **options):
    """``announced``: the (st_dev, st_ino) local rank 0's socket announced, if a path;
    ``target``: an abstract address to knock on instead of the one its secret names."""
    listener = os.getpid() if listener == "self" else listener
    identity = "-" if announced is None else f"{announced[0]}:{announced[1]}"
    return subprocess.Popen([*wrapper, sys.executable, "-c", SENDER, directory or "", token,
                             str(local_rank), name, secret.hex(), str(listener).lower(),
                             identity, target or "-"], **options)


@pytest.mark.parametrize("abstract", [False, True])
def test_job_peer_gets_through_and_a_stranger_is_refused(caplog, abstract):
    directory = None if abstract else make_socket_dir(TOKEN)
    try:
        receiver = SocketEndpoint(token=TOKEN, secret=SECRET, directory=directory, local_rank=0,
                                  peer_pids=[os.getpid(), -1], timeout=20)
        # The stranger even knows the token and claims to be local rank 1; its send
        # completes once the kernel queues the connection.
        announced = receiver.listening_identity
        stranger = _start_sender(directory, 1, "stranger", announced=announced)
        assert stranger.wait(timeout=30) == 0
        legit = _start_sender(directory, 1, "peer", announced=announced)
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
        remove_socket_dir(directory, TOKEN)


def test_missing_peer_times_out_with_its_name(tmp_path):
    directory = make_socket_dir(TOKEN)
    try:
        receiver = SocketEndpoint(token=TOKEN, secret=SECRET, directory=directory, local_rank=0,
                                  peer_pids=[os.getpid(), 1], timeout=0.3)
        with pytest.raises(ExchangeTimeout, match=r"local rank\(s\) \[1\]"):
            receiver.receive_fds({1}, sequence=1)
        receiver.close()
        assert os.listdir(directory) == [CLAIM_NAME]  # the socket file went with close()
    finally:
        remove_socket_dir(directory, TOKEN)
    assert not os.path.exists(directory)


def test_socket_dir_is_private_and_fits_sun_path():
    directory = make_socket_dir(TOKEN)
    try:
        assert os.stat(directory).st_mode & 0o777 == 0o700
        assert socket_path_fits(os.path.join(directory, "r99999.sock"))
    finally:
        remove_socket_dir(directory, TOKEN)


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
        remove_socket_dir(directory, TOKEN)


def _nobody_ids():
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


# A process of another user, who knows the socket's (abstract) name and the job token,
# pushes a memfd at local rank 0 claiming to be local rank 1.
OTHER_USER = textwrap.dedent("""
    import os, socket, sys
    uid, gid, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    os.setgroups([]); os.setgid(gid); os.setuid(uid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(b"\\0" + name.encode())
    except OSError as exc:
        print("connect refused:", exc); sys.exit(0)
    fd = os.memfd_create("bait")
    socket.send_fds(s, [b"IPCS" + sys.argv[4].encode() + bytes(12)], [fd])
    print("sent")
""")


def test_a_process_of_another_user_is_refused_and_logged(caplog):
    ids = _nobody_ids()
    if os.getuid() != 0 or ids is None:
        pytest.skip("needs root (to start a process as 'nobody') and a 'nobody' user")
    # Abstract names are the case where another user can reach the socket at all: a
    # path socket sits in a 0700 directory (test_socket_dir_is_private_and_fits_sun_path).
    receiver = SocketEndpoint(token=TOKEN, secret=SECRET, directory=None, local_rank=0,
                              peer_pids=[os.getpid(), -1], timeout=20)
    try:
        name = receiver.describe_address(0)[1:]
        stranger = subprocess.run([sys.executable, "-c", OTHER_USER, str(ids[0]), str(ids[1]),
                                   name, TOKEN], capture_output=True, text=True, timeout=30)
        assert stranger.returncode == 0, stranger.stderr
        assert "sent" in stranger.stdout
        legit = _start_sender(None, 1, "peer")
        receiver.peer_pids[1] = legit.pid
        with caplog.at_level(logging.WARNING, logger="ipcshare"):
            got = receiver.receive_fds({1}, sequence=1)
        assert legit.wait(timeout=30) == 0
        with got[1] as fd:
            assert os.pread(fd.fileno(), 100, 0) == b"from peer"  # only the job's peer
        assert [uid for _pid, uid in receiver.refused] == [ids[0]]
        assert f"uid {ids[0]}: not a rank of this job" in caplog.text
    finally:
        receiver.close()


def test_another_user_cannot_even_reach_a_path_socket(tmp_path):
    ids = _nobody_ids()
    if os.getuid() != 0 or ids is None:
        pytest.skip("needs root (to start a process as 'nobody') and a 'nobody' user")
    directory = make_socket_dir(TOKEN)
    if directory is None:
        pytest.skip("no directory short enough for socket paths")
    receiver = SocketEndpoint(token=TOKEN, secret=SECRET, directory=directory, local_rank=0,
                              peer_pids=[os.getpid(), -1], timeout=1)
    try:
        probe = textwrap.dedent("""
            import os, socket, sys
            os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1]))
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sys.argv[3]); print("connected")
            except PermissionError:
                print("permission denied")
        """)
        out = subprocess.run([sys.executable, "-c", probe, str(ids[0]), str(ids[1]),
                              receiver.describe_address(0)], capture_output=True, text=True,
                             timeout=30)
        assert out.stdout.strip() == "permission denied", out.stderr
    finally:
        receiver.close()
        remove_socket_dir(directory, TOKEN)


# A rank of another job on the node: same user, its own endpoint and token, knocking on
# our socket (whose name it learnt somehow) with its own descriptor.
OTHER_JOB = textwrap.dedent("""
    import os, socket, sys
    from ipcshare.exchange.unix_socket import SocketEndpoint
    ours, theirs = sys.argv[1], sys.argv[2]
    me = SocketEndpoint(token=theirs, secret=b"another job", directory=None, local_rank=1,
                        peer_pids=[0, os.getpid()], timeout=5)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(b"\\0" + ours.encode())
    fd = os.memfd_create("other-job")
    socket.send_fds(s, [b"IPCS" + theirs.encode() + bytes(12)], [fd])
    me.close()
""")


def test_a_rank_of_another_job_is_refused():
    receiver = SocketEndpoint(token=TOKEN, secret=SECRET, directory=None, local_rank=0,
                              peer_pids=[os.getpid(), -1], timeout=20)
    try:
        other_job = subprocess.run([sys.executable, "-c", OTHER_JOB,
                                    receiver.describe_address(0)[1:], "fedcba9876543210"],
                                   capture_output=True, text=True, timeout=30)
        assert other_job.returncode == 0, other_job.stderr
        legit = _start_sender(None, 1, "peer")
        receiver.peer_pids[1] = legit.pid
        got = receiver.receive_fds({1}, sequence=1)
        assert legit.wait(timeout=30) == 0
        with got[1] as fd:
            assert os.pread(fd.fileno(), 100, 0) == b"from peer"
        assert len(receiver.refused) == 1 and receiver.refused[0][1] == os.getuid()
    finally:
        receiver.close()


def test_abstract_names_carry_the_job_token_and_a_tag_of_its_secret():
    """The token is public (it names the job's folder and tags its handles): a name made
    of it alone could be bound by anyone first. The tag comes from the job's secret."""
    endpoint = SocketEndpoint(token=TOKEN, secret=SECRET, directory=None, local_rank=3,
                              peer_pids=[0] * 4, timeout=1)
    other = SocketEndpoint(token=TOKEN, secret=bytes(32), directory=None, local_rank=3,
                           peer_pids=[0] * 4, timeout=1)
    try:
        name = endpoint.describe_address(3)
        assert re.fullmatch(rf"@ipcshare-{TOKEN}-[0-9a-f]{{16}}-r3", name), name
        assert SECRET.hex()[:16] not in name
        assert other.describe_address(3) != name  # another secret, another name
    finally:
        endpoint.close()
        other.close()


def _unshare_pid_works() -> bool:
    try:
        return subprocess.run(["unshare", "-p", "-f", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _unshare_pid_works(), reason="needs unshare -p (root or user namespaces)")
def test_a_peer_in_another_pid_namespace_is_admitted_by_the_jobs_secret(caplog):
    """Its pid means nothing here, so uid plus a MAC under the job's secret admit it; a
    process of the same user that knows the public token but not the secret is refused,
    and the descriptor it sent is closed."""
    elsewhere = ["unshare", "-p", "-f"]
    receiver = SocketEndpoint(token=TOKEN, secret=SECRET, directory=None, local_rank=0,
                              peer_pids=[os.getpid(), None], timeout=20)
    try:
        # Neither can check our pid: each challenges us, and sends its descriptor once we
        # answered; the stranger's challenge is refused unanswered (its MAC is wrong).
        # Each needs a listener of its own under the same name: one after the other.
        got = {}
        with caplog.at_level(logging.WARNING, logger="ipcshare"):
            receiving = threading.Thread(
                target=lambda: got.update(receiver.receive_fds({1}, sequence=1)))
            receiving.start()
            stranger = _start_sender(None, 1, "stranger", secret=bytes(32),
                                     wrapper=elsewhere, listener=None, stderr=subprocess.PIPE,
                                     target=receiver.describe_address(0))
            _, said = stranger.communicate(timeout=30)
            assert stranger.returncode != 0 and b"listener closed the connection" in said, said
            legit = _start_sender(None, 1, "peer", wrapper=elsewhere, listener=None)
            receiving.join(timeout=30)
        assert legit.wait(timeout=30) == 0
        with got[1] as fd:
            assert os.pread(fd.fileno(), 100, 0) == b"from peer"
        assert len(receiver.refused) == 1
        assert "does not carry this job's secret" in caplog.text
    finally:
        receiver.close()


# Another user that watches /proc/net/unix: once a rank of a job binds its abstract name,
# it binds the name the next rank would take (same pattern, next rank) before that rank.
SQUATTER = textwrap.dedent("""
    import os, re, socket, sys
    os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1]))
    token = sys.argv[3]
    with open("/proc/net/unix") as table:
        names = [line.split()[-1] for line in table if "@ipcshare-" + token in line]
    squatted = []
    for name in names:
        taken = re.sub(r"-r0$", "-r1", name)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(b"\\0" + taken[1:].encode())
            s.listen(1)
            squatted.append(s)
        except OSError:
            pass
    print("squatted", len(squatted), flush=True)
    sys.stdin.read()  # hold the names until told
""")


def test_an_abstract_name_cannot_be_taken_first_from_anothers(caplog):
    """Before: ``@ipcshare-<token>-r<N>``; a ``nobody`` process watching /proc/net/unix
    bound the other ranks' names first, and 4 of 5 jobs failed with ``cannot listen on
    @ipcshare-…-r0: Address already in use``."""
    ids = _nobody_ids()
    if os.getuid() != 0 or ids is None:
        pytest.skip("needs root (to start a process as 'nobody') and a 'nobody' user")
    first = SocketEndpoint(token=TOKEN, secret=SECRET, directory=None, local_rank=0,
                           peer_pids=[os.getpid(), os.getpid()], timeout=1)
    squatter = subprocess.Popen([sys.executable, "-c", SQUATTER, str(ids[0]), str(ids[1]),
                                 TOKEN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    try:
        assert squatter.stdout.readline().strip() == "squatted 1"  # it took a name
        second = SocketEndpoint(token=TOKEN, secret=SECRET, directory=None, local_rank=1,
                                peer_pids=[os.getpid(), os.getpid()], timeout=1)
        second.close()  # it listened: the name it took was not rank 1's
    finally:
        squatter.communicate("", timeout=30)
        first.close()


FLOOD = textwrap.dedent("""
    import socket, sys
    address, count = sys.argv[1], int(sys.argv[2])
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(b"\\0" + address[1:].encode())
        s.close()
    print("sent", count, flush=True)
""")


def test_refusals_of_a_flood_are_counted_not_kept(caplog):
    """Before: every refused connection was kept (145,845 entries after a 15 s flood) and
    each distinct pid logged."""
    receiver = SocketEndpoint(token=TOKEN, secret=SECRET, directory=None, local_rank=0,
                              peer_pids=[os.getpid(), -1], timeout=0.3)
    count = 2000
    try:
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, receiver.describe_address(0),
                                  str(count)], stdout=subprocess.PIPE, text=True)
        with caplog.at_level(logging.WARNING, logger="ipcshare"):
            for _round in range(200):  # local rank 1 never comes: each round times out
                done = flood.poll() is not None
                with pytest.raises(ExchangeTimeout):
                    receiver.receive_fds({1}, sequence=1)
                if done:  # that round took what was still queued
                    break
        assert flood.communicate(timeout=60)[0].strip() == f"sent {count}"
        assert receiver.refused.count == count
        assert len(list(receiver.refused)) <= 16  # the last few, not all
        assert caplog.text.count("refused a descriptor-socket connection") == 1  # one pid
    finally:
        receiver.close()
