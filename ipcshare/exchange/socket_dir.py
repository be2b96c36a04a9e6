"""The node's private socket directory: made with a claim, removed only when provably ours.

A job's local rank 0 makes one 0700 directory named ``ipcshare-<token>-<8 random>`` and
writes a claim file into it (the job token, the creator's pid, the pid's start time and
the pid namespace). Removal, whether at the end of the job, by a survivor after a failure,
by the guard process, or by a later job sweeping what a killed job left behind, deletes
only entries that ipcshare itself puts there (the claim and ``r<N>.sock`` sockets) and
then the empty directory with ``rmdir``: a directory holding anything else, a symlink, a
directory of another user, or one whose name or claim does not match is never touched.
A later job sweeps a directory only once its creator is provably gone (same pid namespace,
and that pid no longer runs the process that wrote the claim) and no socket in it is bound.

The folder that holds the job's directory is trusted only as ssh trusts the folders of its
files: owned by this user (or root), and not writable by group or others unless sticky
(as /tmp is), and so is every folder above it, and every symlink on its path (ssh's
``StrictModes``). Anyone who may rename entries in it could swap the job's directory for
one of their own and collect the descriptors sent there. The job's directory is made and
opened relative to that folder's descriptor, never through a symlink, and every rank
checks the one it opens (this user's, 0700, the very directory local rank 0 made).
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
import tempfile
import time

from ..liveness.pidfd_watch import process_start_time
from ..runtime import settings
from ..runtime.errors import ExchangeError, SettingError
from ..runtime.logs import get_logger

__all__ = ["CLAIM_NAME", "STALE_DIR_AGE_S", "SUN_PATH_MAX", "make_socket_dir",
           "open_socket_dir", "remove_socket_dir", "remove_stale_socket_dirs",
           "socket_dir_base_candidates", "socket_path_fits", "unsafe_base"]

log = get_logger("exchange")

SUN_PATH_MAX = 107  # 108 bytes including the terminating NUL
CLAIM_NAME = ".ipcshare-claim"
# A killed job's directory is swept by a later job only once it is this old (and its
# creator is gone): a directory that a starting job has just made is never raced.
STALE_DIR_AGE_S = 60.0
_DIR_NAME = re.compile(r"ipcshare-(?P<token>[0-9a-f]{16})-[a-z0-9_]{8}")
_SOCKET_NAME = re.compile(r"r[0-9]{1,9}\.sock")
_CLAIM_MAX_BYTES = 4096
_RANDOM_CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789_"  # as mkdtemp's names


def socket_path_fits(path: str) -> bool:
    """Whether ``path`` fits in ``sockaddr_un.sun_path``."""
    return len(os.fsencode(path)) <= SUN_PATH_MAX


def socket_dir_base_candidates() -> list[str]:
    """Where the socket directory may go, in order: $IPCSHARE_SOCKET_DIR, the temp dir, /tmp."""
    return [base for base in (settings.socket_dir(), tempfile.gettempdir(),
                              "/tmp") if base]


def _longest_socket_path(base: str, token: str) -> str:
    """The longest socket path a job's directory under ``base`` holds (the directory's
    8 random characters, a socket name of a 5-digit local rank)."""
    return os.path.join(base, f"ipcshare-{token}-xxxxxxxx", "r99999.sock")


def check_socket_dir_setting() -> None:
    """Refuse an ``IPCSHARE_SOCKET_DIR`` that cannot hold the job's socket directory (it
    used to be passed over in silence for the temp dir, which a container setup that
    relies on a shared mount then failed on much later, or not at all).

    Raises:
        SettingError: set, but not a directory, not writable, or too long a path.
    """
    base = settings.socket_dir()
    if base is None:
        return
    fix = "or unset it"
    if not os.path.isdir(base):
        raise SettingError(f"{settings.SOCKET_DIR}={base!r} is not a directory here: create "
                           f"it (one directory mounted in every container of a node), {fix}",
                           setting=settings.SOCKET_DIR, value=base)
    if not os.access(base, os.W_OK | os.X_OK):
        raise SettingError(f"{settings.SOCKET_DIR}={base!r} is not writable by this user: "
                           f"give the job's user write access, {fix}",
                           setting=settings.SOCKET_DIR, value=base)
    unsafe = unsafe_base(base)
    if unsafe:
        raise SettingError(f"{settings.SOCKET_DIR}={base!r} {unsafe}, {fix}",
                           setting=settings.SOCKET_DIR, value=base)
    probe = _longest_socket_path(base, "0" * 16)
    if not socket_path_fits(probe):
        raise SettingError(f"{settings.SOCKET_DIR}={base!r} is too long for a socket path "
                           f"({len(os.fsencode(probe))} bytes with the job's socket names, at "
                           f"most {SUN_PATH_MAX}): choose a shorter directory, {fix}",
                           setting=settings.SOCKET_DIR, value=base)


def unsafe_base(base: str | int) -> str | None:
    """Why folder ``base`` (a path, or an open descriptor of it) must not hold the job's
    socket directory, ending in its fix; None when it is safe, as ssh's ``StrictModes``
    judges a path: the folder and every folder above it owned by this user or root, and
    not writable by group or others unless sticky; every symlink on the way owned by
    this user or root (anyone else could repoint it), and what it points at judged the
    same way. Given a descriptor, the folder alone is judged (its path was, before it was
    opened)."""
    if isinstance(base, int):
        return _unsafe_folder(os.fstat(base), None)
    return _unsafe_path(base)


_MAX_SYMLINKS = 40  # as the kernel's path walk


def _unsafe_folder(info: os.stat_result, above: str | None) -> str | None:
    """Why a folder whose ``lstat`` is ``info`` is unsafe: the job's own folder (``above``
    None) or a folder ``above`` it on its path."""
    uid = os.getuid()
    where = "" if above is None else f"lies in {above}, which "
    if info.st_uid not in (uid, 0):
        return (f"{where}belongs to uid {info.st_uid}, who could swap the job's socket folder "
                f"{'inside it' if above is None else 'below it'}: use a folder of your own")
    if stat.S_IMODE(info.st_mode) & 0o022 and not info.st_mode & stat.S_ISVTX:
        return (f"{where}is writable by other users and not sticky: any of them could swap "
                f"the job's socket folder {'inside it' if above is None else 'below it'}; "
                "make it private (chmod go-w) or sticky (chmod +t, as /tmp is)")
    return None


def _unsafe_path(path: str) -> str | None:
    """``unsafe_base`` of a path: walk it from ``/`` one component at a time, never
    following a symlink before judging it, judging every folder passed through."""
    uid = os.getuid()
    absolute = path if path.startswith("/") else os.path.join(os.getcwd(), path)
    pending = [part for part in absolute.split("/") if part]
    pending.reverse()  # a stack: the next component last
    current = "/"
    hops = 0
    try:
        why = _unsafe_folder(os.lstat("/"), "/") if pending else _unsafe_folder(
            os.lstat("/"), None)
        while why is None and pending:
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                current = os.path.dirname(current)
                continue
            candidate = os.path.join(current, part)
            info = os.lstat(candidate)
            if stat.S_ISLNK(info.st_mode):
                hops += 1
                if hops > _MAX_SYMLINKS:
                    return "has too many symlinks on its path: give the folder's real path"
                if info.st_uid not in (uid, 0):
                    return (f"passes through the symlink {candidate}, which belongs to uid "
                            f"{info.st_uid}, who could repoint it: give the folder's real "
                            "path, or use a folder of your own")
                target = os.readlink(candidate)
                if target.startswith("/"):
                    current = "/"
                pending.extend(reversed([p for p in target.split("/") if p]))
                continue
            why = _unsafe_folder(info, None if not pending else candidate)
            current = candidate
        return why
    except OSError as exc:
        return f"cannot be checked ({exc.strerror or exc}): give a folder that exists"


def open_socket_dir(path: str, *, identity: tuple[int, int] | None = None) -> int:
    """Open the job's socket directory ``path`` and check it: a directory (not a
    symlink), this user's, mode 0700, and, given ``identity`` (st_dev, st_ino), that very
    directory. Returns the descriptor (the caller closes it).

    Raises:
        ExchangeError: it fails a check (a swapped or foreign directory).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ExchangeError(f"cannot open the job's socket directory {path}: "
                            f"{exc.strerror or exc}") from exc
    info = os.fstat(fd)
    why = None
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) != 0o700:
        why = f"it belongs to uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}"
    elif identity is not None and (info.st_dev, info.st_ino) != tuple(identity):
        why = "it is not the directory local rank 0 made"
    if why:
        os.close(fd)
        raise ExchangeError(f"the job's socket directory {path} was swapped ({why}): "
                            "refusing to pass descriptors through it; keep its folder "
                            "private or sticky")
    return fd


def make_socket_dir(token: str) -> str | None:
    """Create the node's private socket directory with its claim; None when no socket
    path inside it would fit ``sun_path``.

    Before creating, directories that killed jobs left in the same base are swept
    (``remove_stale_socket_dirs``).
    """
    if not re.fullmatch(r"[0-9a-f]{16}", token):
        raise ValueError(f"token must be 16 hex digits, got {token!r}")
    for base in socket_dir_base_candidates():
        probe = _longest_socket_path(base, token)
        if not socket_path_fits(probe) or not os.path.isdir(base):
            continue
        unsafe = unsafe_base(base)  # its whole path, before it is opened
        if unsafe:  # a candidate other than the setting, which is refused by name
            log.info("not making the socket directory in %s: it %s", base, unsafe)
            continue
        try:
            base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            unsafe = unsafe_base(base_fd)
            if unsafe:  # a candidate other than the setting, which is refused by name
                log.info("not making the socket directory in %s: it %s", base, unsafe)
                continue
            remove_stale_socket_dirs(base)
            name = _make_private_dir(base_fd, token)
            if name is None:
                continue
            return os.path.join(base, name)
        finally:
            os.close(base_fd)
    return None


def _make_private_dir(base_fd: int, token: str) -> str | None:
    """Make ``ipcshare-<token>-<8 random>`` (0700) under ``base_fd`` with its claim;
    its name, or None where it cannot be made."""
    for _attempt in range(100):
        name = f"ipcshare-{token}-" + "".join(
            secrets.choice(_RANDOM_CHARACTERS) for _ in range(8))
        try:
            os.mkdir(name, 0o700, dir_fd=base_fd)
        except FileExistsError:
            continue
        except OSError:
            return None
        try:
            dir_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=base_fd)
        except OSError:
            return None   # swapped at once: not ours to remove
        try:
            info = os.fstat(dir_fd)
            if info.st_uid != os.getuid():
                return None
            os.fchmod(dir_fd, 0o700)  # whatever the umask took away, nothing more
            _write_claim(dir_fd, token)
        except OSError:
            os.rmdir(name, dir_fd=base_fd)  # just made, empty: provably ours
            return None
        finally:
            os.close(dir_fd)
        return name
    return None


def remove_socket_dir(directory: str | None, token: str) -> bool:
    """Remove the job's socket directory: only its claim and sockets, then the directory.

    Safe to call from any rank of the job and from its guard (idempotent; a directory
    that is not this job's, by name or claim, or that holds anything else, is left).
    Returns whether the directory is gone.
    """
    if not directory:
        return True
    base, name = os.path.split(os.path.normpath(directory))
    match = _DIR_NAME.fullmatch(name)
    if match is None or match["token"] != token:
        log.warning("not removing %s: not this job's socket directory", directory)
        return False
    try:
        base_fd = os.open(base or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        return _remove_claimed(base_fd, name, token, bound=None) in ("removed", "gone")
    finally:
        os.close(base_fd)


def remove_stale_socket_dirs(base: str, *, min_age: float = STALE_DIR_AGE_S) -> list[str]:
    """Remove socket directories under ``base`` that killed jobs of this user left.

    A directory is removed only when all of these hold: its name is exactly the generated
    pattern; it is a real directory (not a symlink) owned by this user with mode 0700 and
    older than ``min_age`` seconds; it holds a claim file naming the same token; the
    claim's creator is provably gone (same pid namespace as this process, and that pid is
    no longer the process that wrote the claim); and everything else in it is an unbound
    ``r<N>.sock`` socket. Returns the directories removed.
    """
    bound = _bound_socket_paths()
    if bound is None:  # cannot tell which sockets are in use: sweep nothing
        return []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    try:
        base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return []
    try:
        for name in names:
            match = _DIR_NAME.fullmatch(name)
            if match is None:
                continue
            outcome = _remove_claimed(base_fd, name, match["token"], bound=bound,
                                      stale_after=min_age, base=base)
            if outcome == "removed":
                path = os.path.join(base, name)
                removed.append(path)
                log.info("removed %s, left behind by a job that was killed", path)
    finally:
        os.close(base_fd)
    return removed


def _write_claim(dir_fd: int, token: str) -> None:
    claim = {"token": token, "pid": os.getpid(), "start": process_start_time(os.getpid()),
             "pid_ns": _pid_namespace("self")}
    fd = os.open(CLAIM_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                 dir_fd=dir_fd)
    with os.fdopen(fd, "w") as out:
        json.dump(claim, out)


def _remove_claimed(base_fd: int, name: str, token: str, *, bound: set[str] | None,
                    stale_after: float | None = None, base: str = "") -> str:
    """Remove directory ``name`` under ``base_fd`` if every check passes.

    Returns "removed", "gone" (nothing there) or "kept". With ``stale_after`` the
    directory must also be that old, its creator gone and none of its sockets in
    ``bound`` (the sweep of a killed job's leftovers); without, it is this job's own.
    """
    try:
        # O_NOFOLLOW: a symlink planted under the generated name is never followed.
        dir_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=base_fd)
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "kept"
    try:
        info = os.fstat(dir_fd)
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) != 0o700:
            return "kept"
        if stale_after is not None and time.time() - info.st_mtime < stale_after:
            return "kept"
        claim = _read_claim(dir_fd)
        if claim is None or claim.get("token") != token:
            return "kept"
        if stale_after is not None and not _creator_gone(claim):
            return "kept"
        sockets = []
        for entry in os.listdir(dir_fd):
            if entry == CLAIM_NAME:
                continue
            if not _SOCKET_NAME.fullmatch(entry):
                return "kept"
            entry_info = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISSOCK(entry_info.st_mode) or entry_info.st_uid != os.getuid():
                return "kept"
            if bound is not None and os.path.join(base, name, entry) in bound:
                return "kept"
            sockets.append(entry)
        for entry in [*sockets, CLAIM_NAME]:
            try:
                os.unlink(entry, dir_fd=dir_fd)
            except FileNotFoundError:
                pass  # another rank of the job removed it first
    except OSError:
        return "kept"
    finally:
        os.close(dir_fd)
    try:
        os.rmdir(name, dir_fd=base_fd)
    except FileNotFoundError:
        return "gone"
    except OSError as exc:
        # Something appeared meanwhile (ENOTEMPTY): it is not ours to remove.
        if exc.errno != errno.ENOTEMPTY:
            log.debug("rmdir %s: %s", name, exc)
        return "kept"
    return "removed"


def _read_claim(dir_fd: int) -> dict | None:
    try:
        fd = os.open(CLAIM_NAME, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return None
        data = os.read(fd, _CLAIM_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _CLAIM_MAX_BYTES:
        return None
    try:
        claim = json.loads(data)
    except ValueError:
        return None
    return claim if isinstance(claim, dict) else None


def _creator_gone(claim: dict) -> bool:
    """Whether the process that wrote ``claim`` has provably ended."""
    pid, start, namespace = claim.get("pid"), claim.get("start"), claim.get("pid_ns")
    if not isinstance(pid, int) or pid <= 0 or namespace is None:
        return False
    if namespace != _pid_namespace("self"):
        return False  # its pid means another process here: we cannot tell
    current = process_start_time(pid)
    return current is None or current != start


def _pid_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _bound_socket_paths() -> set[str] | None:
    """Paths of the unix sockets bound in this network namespace, or None if unknown."""
    try:
        with open("/proc/net/unix") as table:
            next(table)  # header
            return {fields[7] for fields in (line.split() for line in table) if len(fields) > 7}
    except (OSError, StopIteration):
        return None
