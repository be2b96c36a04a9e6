"""The socket directory's cleanup removes only what ipcshare provably made (issue: a sweep
once deleted any old ``ipcshare-*`` directory of the user, data included)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from ipcshare.exchange.socket_dir import (
    CLAIM_NAME,
    check_socket_dir_setting,
    make_socket_dir,
    remove_socket_dir,
    remove_stale_socket_dirs,
)

TOKEN = "0123456789abcdef"
OTHER_TOKEN = "fedcba9876543210"
TWO_DAYS = 2 * 86400

# A job's local rank 0 as a killed job leaves it: directory, claim and an unbound socket,
# then the process is gone without cleaning up.
KILLED_JOB = textwrap.dedent("""
    import os, socket, sys
    from ipcshare.exchange.socket_dir import make_socket_dir
    os.environ["IPCSHARE_SOCKET_DIR"] = sys.argv[1]
    directory = make_socket_dir(sys.argv[2])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(directory, "r0.sock"))
    print(directory)
    os._exit(0)
""")


@pytest.fixture
def tmp_path():
    """A short base directory: pytest's own is too long for a socket path inside it
    (``make_socket_dir`` would then move on to /tmp)."""
    base = tempfile.mkdtemp(prefix="sd-", dir="/tmp")
    yield Path(base)
    shutil.rmtree(base)  # made by this fixture


def _killed_job_dir(base, token=TOKEN) -> str:
    out = subprocess.run([sys.executable, "-c", KILLED_JOB, str(base), token],
                         capture_output=True, text=True, timeout=60, check=True)
    directory = out.stdout.strip()
    assert os.path.dirname(directory) == str(base)
    return directory


def _rewrite_claim(directory, **changes) -> None:
    path = os.path.join(directory, CLAIM_NAME)
    with open(path) as current:
        claim = json.load(current)
    claim.update(changes)
    with open(path, "w") as out:
        json.dump(claim, out)


def _age(path, seconds=TWO_DAYS) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def _tree(path) -> dict[str, bytes | None]:
    """Every file under ``path`` with its bytes (None for non-regular files)."""
    found: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            found[os.path.relpath(full, path)] = None
            if os.path.isfile(full) and not os.path.islink(full):
                with open(full, "rb") as content:
                    found[os.path.relpath(full, path)] = content.read()
    return found


def test_a_killed_jobs_directory_is_swept(tmp_path):
    stale = _killed_job_dir(tmp_path)
    assert sorted(os.listdir(stale)) == [CLAIM_NAME, "r0.sock"]
    _age(stale)
    assert remove_stale_socket_dirs(str(tmp_path)) == [stale]
    assert not os.path.exists(stale)


def test_a_young_directory_is_kept(tmp_path):
    stale = _killed_job_dir(tmp_path)
    assert remove_stale_socket_dirs(str(tmp_path)) == []
    assert os.path.isdir(stale)


def test_decoys_survive_the_sweep(tmp_path):
    # 1. The user's own directory with our prefix (the reproduction).
    results = tmp_path / "ipcshare-my-results"
    results.mkdir()
    (results / "x").write_text("data\n")
    # 2. Exactly the generated pattern, a dead creator's claim, but also a user file.
    with_file = _killed_job_dir(tmp_path)
    with open(os.path.join(with_file, "notes.txt"), "w") as notes:
        notes.write("keep me\n")
    # 3. A symlink with a generated name, pointing at a directory that would pass.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = _killed_job_dir(elsewhere)
    link = tmp_path / "ipcshare-0123456789abcdef-linkabcd"
    os.symlink(target, link)
    # 4. A regular file with a generated name.
    plain = tmp_path / "ipcshare-0123456789abcdef-fileabcd"
    plain.write_text("not a directory\n")
    # 5. A claim naming another token than the directory's name.
    mismatched = _killed_job_dir(tmp_path)
    _rewrite_claim(mismatched, token=OTHER_TOKEN)
    # 6. A generated name with no claim (a user's copy, or an older ipcshare's directory).
    unclaimed = tmp_path / "ipcshare-0123456789abcdef-noclaimx"
    unclaimed.mkdir(mode=0o700)
    # 7. Its creator still runs (this process wrote the claim).
    os.environ["IPCSHARE_SOCKET_DIR"] = str(tmp_path)
    try:
        alive = make_socket_dir(TOKEN)
    finally:
        del os.environ["IPCSHARE_SOCKET_DIR"]
    # 8. A claim from another pid namespace: its pid means nothing here.
    foreign = _killed_job_dir(tmp_path)
    _rewrite_claim(foreign, pid_ns="pid:[1]")
    # 9. A socket still bound (a job that runs in another pid namespace, say).
    live = _killed_job_dir(tmp_path)
    os.unlink(os.path.join(live, "r0.sock"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(live, "r0.sock"))
    try:
        for entry in tmp_path.iterdir():
            _age(entry)
        _age(target)
        before = {entry.name: _tree(entry) if entry.is_dir() and not entry.is_symlink()
                  else None for entry in tmp_path.iterdir()}
        target_before = _tree(target)

        assert remove_stale_socket_dirs(str(tmp_path)) == []

        after = {entry.name: _tree(entry) if entry.is_dir() and not entry.is_symlink()
                 else None for entry in tmp_path.iterdir()}
        assert after == before
        assert (results / "x").read_text() == "data\n"
        assert os.path.islink(link) and _tree(target) == target_before
        # The sweep of the symlink's own base still removes the real leftover there.
        assert remove_stale_socket_dirs(os.path.dirname(target)) == [target]
    finally:
        listener.close()
        remove_socket_dir(alive, TOKEN)


def test_another_users_directory_is_kept(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    stale = _killed_job_dir(tmp_path)
    for path in (os.path.join(stale, name) for name in os.listdir(stale)):
        os.chown(path, 65534, 65534, follow_symlinks=False)
    os.chown(stale, 65534, 65534)
    _age(stale)
    assert remove_stale_socket_dirs(str(tmp_path)) == []
    assert sorted(os.listdir(stale)) == [CLAIM_NAME, "r0.sock"]


def test_the_job_removes_its_own_directory_but_nothing_foreign(tmp_path, monkeypatch):
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(tmp_path))
    directory = make_socket_dir(TOKEN)
    dead_rank = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead_rank.bind(os.path.join(directory, "r1.sock"))  # a rank that died left this
    dead_rank.close()
    assert not remove_socket_dir(directory, OTHER_TOKEN)  # not that job's directory
    assert os.path.isdir(directory)
    assert remove_socket_dir(directory, TOKEN)
    assert not os.path.exists(directory)
    assert remove_socket_dir(directory, TOKEN)  # idempotent

    directory = make_socket_dir(TOKEN)
    with open(os.path.join(directory, "results.csv"), "w") as out:
        out.write("1,2\n")  # someone put a file there: the directory stays
    assert not remove_socket_dir(directory, TOKEN)
    assert sorted(os.listdir(directory)) == [CLAIM_NAME, "results.csv"]  # all left as it was
    assert not remove_socket_dir(str(tmp_path / "ipcshare-my-results"), TOKEN)


def test_the_guard_removes_only_the_jobs_socket_directory(tmp_path, monkeypatch):
    """The guard's ``clean-sockets`` command goes through the same checks."""
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(tmp_path))
    directory = make_socket_dir(TOKEN)
    decoy = tmp_path / "ipcshare-my-results"
    decoy.mkdir()
    (decoy / "x").write_text("data\n")
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        own_fd, peer_fd = os.pidfd_open(own.pid), os.pidfd_open(peer.pid)
        spec = {"pid": own.pid, "rank_pidfd": own_fd, "grace": 0.1, "me": "rank 0",
                "peers": {str(peer_fd): "rank 1"}, "linger": 0}
        guard = subprocess.Popen([sys.executable, "-m", "ipcshare.exchange.peer_guard",
                                  json.dumps(spec)],
                                 stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                 pass_fds=[own_fd, peer_fd])
        os.close(own_fd)
        os.close(peer_fd)
        guard.stdin.write(f"clean-sockets {TOKEN} {directory}\n".encode())
        guard.stdin.write(f"clean-sockets {TOKEN} {decoy}\n".encode())
        guard.stdin.flush()
        time.sleep(0.5)  # let the guard read its commands before the peer dies
        peer.kill()
        assert guard.wait(timeout=30) == 1
        guard.stdin.close()
        with guard.stderr:
            assert b"rank 1 died" in guard.stderr.read()
        assert own.wait(timeout=30) != 0  # ended by the guard
        assert not os.path.exists(directory)
        assert (decoy / "x").read_text() == "data\n"
    finally:
        for process in (peer, own):
            process.kill()
            process.wait()


def test_a_socket_dir_setting_that_cannot_hold_the_job_s_directory_is_refused(tmp_path,
                                                                              monkeypatch):
    # It used to be passed over in silence for the temp dir.
    from ipcshare.runtime.errors import ConfigError

    afile = tmp_path / "afile"
    afile.write_text("")
    long = tmp_path / ("d" * 80)
    long.mkdir()
    for value, says in ((tmp_path / "missing", "is not a directory here: create it"),
                        (afile, "is not a directory here"),
                        (long, "is too long for a socket path")):
        monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(value))
        with pytest.raises(ConfigError, match=rf"^IPCSHARE_SOCKET_DIR='{value}' {says}"):
            check_socket_dir_setting()
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(tmp_path))
    check_socket_dir_setting()  # a directory of ours: fine
    monkeypatch.delenv("IPCSHARE_SOCKET_DIR")
    check_socket_dir_setting()  # unset: the temp dir
