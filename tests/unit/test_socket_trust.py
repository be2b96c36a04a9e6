"""The descriptor sockets trust a folder only when it is safe, and send only to a proven
rank: a folder that others may write without the sticky bit is refused by
name; a job directory swapped after its check, or a symlink put in its place, can neither
receive the job's socket nor make the job remove someone else's files; a socket that
another process holds never gets a descriptor."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

from ipcshare.exchange import unix_socket
from ipcshare.exchange.socket_dir import (
    check_socket_dir_setting,
    make_socket_dir,
    open_socket_dir,
    remove_socket_dir,
)
from ipcshare.exchange.unix_socket import SocketEndpoint
from ipcshare.runtime.errors import ConfigError, ExchangeError

from ..local_users import SECOND_USER_REASON, second_local_user

# Of this process: the abstract socket names hold it, and two pytest-xdist workers must not
# share them.
TOKEN = secrets.token_hex(8)
SECRET = bytes(range(32))


needs_second_user = pytest.mark.skipif(second_local_user() is None, reason=SECOND_USER_REASON)


@pytest.fixture
def base():
    """A short folder of ours (socket paths must fit 107 bytes)."""
    path = tempfile.mkdtemp(prefix="st-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path)  # made by this fixture


def test_a_folder_others_may_write_without_the_sticky_bit_is_refused(base, monkeypatch):
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # what `mkdir -m 0777` gives: anyone may rename entries
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(shared))
    with pytest.raises(ConfigError, match=rf"^IPCSHARE_SOCKET_DIR='{shared}' is writable by "
                       r"other users and not sticky: .* make it private \(chmod go-w\) or "
                       r"sticky \(chmod \+t, as /tmp is\), or unset it$"):
        check_socket_dir_setting()
    shared.chmod(0o775)  # a group may rename entries too
    with pytest.raises(ConfigError, match="is writable by other users and not sticky"):
        check_socket_dir_setting()
    shared.chmod(0o1777)  # sticky, as /tmp: only the owner of an entry may rename it
    check_socket_dir_setting()
    directory = make_socket_dir(TOKEN)
    try:
        assert directory is not None and os.path.dirname(directory) == str(shared)
        assert os.stat(directory).st_mode & 0o7777 == 0o700
    finally:
        remove_socket_dir(directory, TOKEN)
    shared.chmod(0o700)
    check_socket_dir_setting()


@needs_second_user
def test_a_folder_of_another_user_is_refused(base, monkeypatch):
    uid, gid = second_local_user()
    theirs = base / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, uid, gid)  # root may write there; its owner may swap what we put
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(theirs))
    with pytest.raises(ConfigError, match=rf"IPCSHARE_SOCKET_DIR='{theirs}' belongs to uid "
                       rf"{uid}, who could swap the job's socket folder inside it"):
        check_socket_dir_setting()


@needs_second_user
def test_a_path_through_another_users_symlink_is_refused(base, monkeypatch):
    """Its owner may replace the symlink whenever it likes: the socket folder would move
    under the job (before: accepted, and repointing it every 2-200 ms failed 8 of 12
    jobs)."""
    uid, gid = second_local_user()
    sticky = base / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # a safe folder, as /tmp is
    link = base / "link"
    link.symlink_to(sticky)
    os.lchown(link, uid, gid)
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(link / "."))
    with pytest.raises(ConfigError, match=rf"passes through the symlink {link}, which belongs "
                       rf"to uid {uid}, who could repoint it"):
        check_socket_dir_setting()
    os.lchown(link, 0, 0)  # a symlink of ours (root's) to a safe folder is fine
    check_socket_dir_setting()


def test_a_folder_below_a_folder_others_may_write_is_refused(base, monkeypatch):
    """The job's folder is ours and private, but anyone may rename it away from the
    folder above it and put another in its place (before: only the last component was
    checked)."""
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    mine = shared / "mine"
    mine.mkdir(mode=0o700)
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(mine))
    with pytest.raises(ConfigError, match=rf"IPCSHARE_SOCKET_DIR='{mine}' lies in {shared}, "
                       "which is writable by other users and not sticky"):
        check_socket_dir_setting()
    shared.chmod(0o1777)  # sticky: nobody else may rename what is ours in it
    check_socket_dir_setting()


def test_an_unsafe_temp_dir_is_passed_over(base, monkeypatch):
    shared = base / "tmp"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.delenv("IPCSHARE_SOCKET_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    directory = make_socket_dir(TOKEN)
    try:
        assert directory is None or not directory.startswith(str(shared))
        assert list(shared.iterdir()) == []
    finally:
        remove_socket_dir(directory, TOKEN)
        tempfile.tempdir = None


def test_a_job_directory_that_is_a_symlink_or_swapped_is_refused(base, monkeypatch):
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(base))
    directory = make_socket_dir(TOKEN)
    try:
        info = os.stat(directory)
        os.close(open_socket_dir(directory, identity=(info.st_dev, info.st_ino)))
        # Swapped: another directory of ours under the same name.
        os.rename(directory, directory + ".away")
        os.mkdir(directory, 0o700)
        with pytest.raises(ExchangeError, match="was swapped .*not the directory local rank 0"):
            open_socket_dir(directory, identity=(info.st_dev, info.st_ino))
        os.rmdir(directory)
        # A symlink to a directory that would pass every other check.
        os.symlink(directory + ".away", directory)
        with pytest.raises(ExchangeError, match="cannot open the job's socket directory"):
            open_socket_dir(directory)
        os.unlink(directory)
        os.rename(directory + ".away", directory)
    finally:
        remove_socket_dir(directory, TOKEN)


RELAY = Path(__file__).parents[1] / "faults" / "socket_relay.py"


def _endpoint_refused(directory: str, said: str) -> None:
    """Making local rank 0's endpoint in ``directory`` raises ExchangeError saying ``said``."""
    with pytest.raises(ExchangeError, match=said):
        SocketEndpoint(token=TOKEN, secret=SECRET, directory=directory, local_rank=0,
                       peer_pids=[os.getpid()], timeout=1)


def test_a_socket_relayed_right_after_the_bind_is_never_announced(base, monkeypatch):
    """A process of this user renames the socket away the moment it is bound and binds a
    relay under its name, which passes every byte on to the real one: the rank must not
    announce the relay's inode (it would then get every descriptor sent to this rank).
    The probe through the file's descriptor reaches the listener only by way of the
    relay's own connection, which is not this process's. Before: the relay passed the
    probe on, and took descriptors in 3 of 20 CLI jobs."""
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(base))
    directory = make_socket_dir(TOKEN)
    relays = []
    chmod = os.chmod

    def chmod_then_relay(path, mode):
        chmod(path, mode)
        relay = subprocess.Popen([sys.executable, str(RELAY), str(base), "10", "--once"],
                                 stdout=subprocess.PIPE, text=True)
        relays.append(relay)
        assert relay.stdout.readline().strip() == "ready"

    monkeypatch.setattr(unix_socket.os, "chmod", chmod_then_relay)
    try:
        _endpoint_refused(directory, "is not the one this rank bound: it was replaced right "
                          "after the bind; refusing to announce it")
    finally:
        monkeypatch.undo()
        for relay in relays:
            relay.terminate()
            said, _ = relay.communicate(timeout=30)
            assert said.strip() == "swapped 1 stolen 0"
        for leftover in os.listdir(directory):  # the relay's, and our renamed socket
            if leftover != ".ipcshare-claim":
                os.unlink(os.path.join(directory, leftover))
        remove_socket_dir(directory, TOKEN)


def test_a_folder_swapped_between_the_check_and_the_bind_is_refused(base, monkeypatch):
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(base))
    directory = make_socket_dir(TOKEN)
    opened = unix_socket.open_socket_dir

    def open_then_swap(path, **kwargs):
        fd = opened(path, **kwargs)
        os.rename(path, path + ".away")   # the check passed; now the path leads elsewhere
        os.mkdir(path, 0o700)
        return fd

    monkeypatch.setattr(unix_socket, "open_socket_dir", open_then_swap)
    try:
        _endpoint_refused(directory, "is gone from the job's socket directory: renamed right "
                          "after the bind, or its folder swapped after it was checked")
    finally:
        shutil.rmtree(directory)
        os.rename(directory + ".away", directory)
        remove_socket_dir(directory, TOKEN)


def test_closing_never_removes_what_a_symlink_swapped_in_points_at(base, monkeypatch):
    # Before: the final unlink went by path, and removed victim/r0.sock, a regular file of
    # another owner, through a symlink swapped in for the job's directory.
    victim = base / "victim"
    victim.mkdir()
    (victim / "r0.sock").write_text("not yours\n")
    if second_local_user() is not None:
        os.chown(victim / "r0.sock", *second_local_user())
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(base))
    directory = make_socket_dir(TOKEN)
    endpoint = SocketEndpoint(token=TOKEN, secret=SECRET, directory=directory, local_rank=0,
                              peer_pids=[os.getpid()], timeout=1)
    os.rename(directory, directory + ".away")
    os.symlink(victim, directory)
    endpoint.close()
    endpoint.close()  # idempotent
    assert (victim / "r0.sock").read_text() == "not yours\n"
    # Its own socket went, from where it really is.
    assert sorted(os.listdir(directory + ".away")) == [".ipcshare-claim"]
    os.unlink(directory)
    os.rename(directory + ".away", directory)
    assert remove_socket_dir(directory, TOKEN)


def _squatter(address: bytes, answer: bytes | None = None):
    """A listener of this process on ``address`` (not the rank the sender expects);
    returns it and a function giving the descriptors it received."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(4)
    got: list[int] = []

    def serve() -> None:
        listener.settimeout(10)
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(2)
            try:
                _data, fds, _flags, _ = socket.recv_fds(conn, 4096, 4)
                got.extend(fds)
                if answer is not None:  # play along with a challenge, without the secret
                    conn.sendall(answer)
                    _data, fds, _flags, _ = socket.recv_fds(conn, 4096, 4)
                    got.extend(fds)
            except OSError:
                pass

    thread = threading.Thread(target=serve)
    thread.start()
    return listener, thread, got


@pytest.mark.parametrize("checkable", [True, False])
def test_a_descriptor_goes_only_to_a_listener_proven_to_be_the_rank(checkable):
    # Abstract names can be bound by anyone first. With the rank's pid known, the sender
    # sees another pid there; without (another PID namespace), the listener cannot
    # answer the challenge without the job's secret. Before: the squatter got the memfd.
    sender = SocketEndpoint(token=TOKEN, secret=SECRET, directory=None, local_rank=1,
                            peer_pids=[1 if checkable else None, os.getpid()], timeout=5)
    listener, thread, got = _squatter(sender.address_of(0), answer=bytes(48))
    memfd = os.memfd_create("secret-data")
    try:
        said = (r"is held by pid \d+ uid \d+, not by that rank \(pid 1 uid \d+\)" if checkable
                else "does not prove this job's secret")
        with pytest.raises(ExchangeError, match=said + ": no descriptor sent to it"):
            sender.send_fd(0, memfd, 1)
    finally:
        thread.join(timeout=30)
        listener.close()
        sender.close()
        os.close(memfd)
    assert got == []


OTHER_USER_LISTENER = textwrap.dedent("""
    import os, socket, sys
    os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1]))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(b"\\0" + sys.argv[3].encode()); s.listen(4); s.settimeout(10)
    print("listening", flush=True)
    conn, _ = s.accept(); conn.settimeout(2)
    try:
        _data, fds, _flags, _ = socket.recv_fds(conn, 4096, 4)
    except OSError:
        fds = []
    print("descriptors", len(fds), flush=True)
""")


@needs_second_user
def test_another_user_squatting_a_ranks_socket_gets_nothing():
    uid, gid = second_local_user()
    sender = SocketEndpoint(token=TOKEN, secret=SECRET, directory=None, local_rank=1,
                            peer_pids=[None, os.getpid()], timeout=5)
    squatter = subprocess.Popen([sys.executable, "-c", OTHER_USER_LISTENER, str(uid), str(gid),
                                 sender.describe_address(0)[1:]], stdout=subprocess.PIPE,
                                text=True)
    memfd = os.memfd_create("secret-data")
    try:
        assert squatter.stdout.readline().strip() == "listening"
        with pytest.raises(ExchangeError, match=rf"is held by pid \d+ uid {uid}, not by that "
                           "rank"):
            sender.send_fd(0, memfd, 1)
        out, _ = squatter.communicate(timeout=30)
        assert out.strip() == "descriptors 0"
    finally:
        squatter.kill()
        squatter.wait()
        sender.close()
        os.close(memfd)
