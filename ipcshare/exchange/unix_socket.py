"""Descriptor passing with SCM_RIGHTS over unix sockets that admit only this job's ranks.

Every rank listens on its own socket inside the job's private (0700) directory, whose
name carries a per-job random token; when the path would not fit ``sun_path`` (108
bytes) the socket goes to the abstract namespace under the same token. Both ends check
the other before a descriptor moves:

- the receiver checks the connecting process with SO_PEERCRED (same uid, and the pid of
  the rank the header claims) before it reads anything, and the header's MAC;
- the sender checks the listening process the same way right after ``connect``: a
  socket that someone else bound (a swapped folder, a squatted abstract name) never
  gets a descriptor.

A peer in another PID namespace has no pid that means anything here (SO_PEERCRED reports
0, or its pid in ours): it is admitted by uid, and then by the job's secret, which only
the job's ranks received (over MPI; the token in socket names is public, the secret
never leaves the job). The sender's header carries a MAC under the secret; a sender that
cannot check the listener's pid also sends a random challenge instead of the
descriptor, and sends the descriptor only once the listener has answered with a MAC of
that challenge. Whatever a connection that is not provably a rank of the job sends (a
stranger's garbage, a wrong MAC, a stalled or broken message) is refused, logged once,
and the exchange carries on.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable

from ..runtime.errors import ExchangeError, ExchangeTimeout
from ..runtime.logs import get_logger
from ..runtime.owned_fd import OwnedFd
from .socket_dir import open_socket_dir

__all__ = ["SocketEndpoint"]

log = get_logger("exchange")

_MAGIC = b"IPCS"
# magic, job token (16 hex chars), sender local rank, sequence number
_FIELDS = struct.Struct("!4s16sIQ")
_NONCE_BYTES = 16  # the sender's challenge to a listener whose pid it cannot check
_NO_CHALLENGE = bytes(_NONCE_BYTES)
_MAC_BYTES = 32  # HMAC-SHA256 under the job's secret
_HEADER = struct.Struct(f"!{_FIELDS.size}s{_NONCE_BYTES}s{_MAC_BYTES}s")
# What follows an answered challenge: one byte carrying the descriptor.
_DESCRIPTOR_BYTE = b"F"
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_LIVENESS_POLL_S = 0.05


class _Refused(Exception):
    """A connection that is not provably a rank of the job misbehaved: refuse it."""


class SocketEndpoint:
    """This rank's listening socket plus what it needs to check its peers."""

    def __init__(self, *, token: str, secret: bytes, directory: str | None, local_rank: int,
                 peer_pids: list[int | None], timeout: float,
                 peer_check: Callable[[str], None] | None = None,
                 identity: tuple[int, int] | None = None) -> None:
        """``peer_pids[local rank]`` is that rank's pid as this process sees it, or None
        for a rank in another PID namespace (admitted by uid and the secret's MAC).
        ``directory`` is opened and checked (``open_socket_dir``: this user's, 0700, no
        symlink, and the very directory ``identity`` (st_dev, st_ino) names, if given);
        the endpoint proves through that descriptor that its socket landed there, and
        removes only that socket.

        Raises:
            ExchangeError: the directory fails its checks, or the socket cannot listen.
        """
        self.token = token
        self._secret = secret
        self.directory = directory
        self._directory_fd = (None if directory is None
                              else open_socket_dir(directory, identity=identity))
        self.local_rank = local_rank
        self.peer_pids = peer_pids
        self.timeout = timeout
        # Raises when a peer died (PeerWatch.check): waits end at once instead of timing out.
        self.peer_check = peer_check or (lambda _doing: None)
        self.refused: list[tuple[int, int]] = []  # (pid, uid) of turned-away connections
        self._uid = os.getuid()
        self._listener: socket.socket | None = None
        self._bound: tuple[str, int, int] | None = None  # name, st_dev, st_ino
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            address = self.address_of(local_rank)
            listener.bind(address)
            if isinstance(address, str):
                self._bound = self._check_bound(address)
                os.chmod(address, 0o600)
            listener.listen(max(16, 2 * len(peer_pids)))
        except OSError as exc:
            listener.close()
            self._close_directory()
            raise ExchangeError(f"cannot listen on {self.describe_address(local_rank)}: "
                                f"{exc.strerror or exc}") from exc
        except BaseException:
            listener.close()
            self._close_directory()
            raise
        self._listener = listener

    def _check_bound(self, address: str) -> tuple[str, int, int]:
        """Prove that the socket just bound at ``address`` is in the checked directory
        (its folder was not swapped between the check and the bind): only this user can
        create entries there, and this name was not there before."""
        name = os.path.basename(address)
        assert self._directory_fd is not None
        try:
            info = os.stat(name, dir_fd=self._directory_fd, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is None or not stat.S_ISSOCK(info.st_mode) or info.st_uid != self._uid:
            raise ExchangeError(f"the socket bound at {address} is not in the job's socket "
                                "directory: its folder was swapped after it was checked; "
                                "refusing to use it")
        return name, info.st_dev, info.st_ino

    @property
    def namespace(self) -> str:
        """``'path'`` for sockets in the private directory, ``'abstract'`` otherwise."""
        return "path" if self.directory else "abstract"

    def address_of(self, local_rank: int) -> str | bytes:
        if self.directory:
            return os.path.join(self.directory, f"r{local_rank}.sock")
        return f"\0ipcshare-{self.token}-r{local_rank}".encode()

    def describe_address(self, local_rank: int) -> str:
        address = self.address_of(local_rank)
        return address if isinstance(address, str) else "@" + address[1:].decode()

    def share(self, fd: int, peers: list[int], sequence: int) -> dict[int, OwnedFd]:
        """Send ``fd`` to every local rank in ``peers`` and receive one descriptor from
        each of them.

        Where every peer's pid can be checked no sender waits for an answer (the kernel
        queues each descriptor), so this rank sends, then receives. Otherwise a sender
        that challenges a listener waits for its answer, which that rank gives while it
        sends too: this rank receives in a thread of its own meanwhile. (Not always:
        receiving in a thread measured about 4 ms more per window at 2 ranks on 2 cores.)

        Raises:
            ExchangeTimeout / ExchangeError / PeerDied: as ``send_fd`` and
                ``receive_fds``.
        """
        if None not in self.peer_pids:
            for peer in peers:
                self.send_fd(peer, fd, sequence)
            return self.receive_fds(set(peers), sequence)
        received: dict[int, OwnedFd] = {}
        failure: list[BaseException] = []
        stop = threading.Event()

        def receive() -> None:
            try:
                received.update(self.receive_fds(set(peers), sequence, stop=stop))
            except BaseException as exc:  # handed to the caller's thread below
                failure.append(exc)

        receiver = threading.Thread(target=receive, name="ipcshare-fd-receiver", daemon=True)
        receiver.start()
        try:
            for peer in peers:
                self.send_fd(peer, fd, sequence)
        except BaseException:
            stop.set()
            raise
        finally:
            receiver.join()
            if stop.is_set():
                for owned in received.values():
                    owned.close()
        if failure:
            raise failure[0]
        return received

    def send_fd(self, peer_local_rank: int, fd: int, sequence: int) -> None:
        """Push ``fd`` to a peer's socket, once the listener there is proven to be that
        peer (the kernel queues it until the peer accepts).

        Raises:
            ExchangeError: the socket is held by a process that is not that rank.
            ExchangeTimeout: the peer did not listen, or did not answer, in time.
        """
        deadline = time.monotonic() + self.timeout
        address = self.address_of(peer_local_rank)
        where = f"local rank {peer_local_rank} at {self.describe_address(peer_local_rank)}"
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(address)
                expected_pid = self.peer_pids[peer_local_rank]
                pid, uid, _gid = _PEERCRED.unpack(
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
                if uid != self._uid or (expected_pid is not None and pid != expected_pid):
                    raise ExchangeError(
                        f"the socket of {where} is held by pid {pid} uid {uid}, not by that "
                        "rank (pid " + ("?" if expected_pid is None else str(expected_pid))
                        + f" uid {self._uid}): no descriptor sent to it")
                if expected_pid is not None:
                    socket.send_fds(sock, [self._header(self.local_rank, sequence,
                                                        _NO_CHALLENGE)], [fd])
                    return
                # Its pid means nothing here: it must prove the job's secret first.
                nonce = secrets.token_bytes(_NONCE_BYTES)
                sock.sendall(self._header(self.local_rank, sequence, nonce))
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                answer = _receive_exactly(sock, _MAC_BYTES)
                if not hmac.compare_digest(answer, self._answer(peer_local_rank, nonce)):
                    raise ExchangeError(f"the listener of {where} (pid {pid} uid {uid}) does "
                                        "not prove this job's secret: no descriptor sent "
                                        "to it")
                socket.send_fds(sock, [_DESCRIPTOR_BYTE], [fd])
                return
            except (ConnectionRefusedError, FileNotFoundError, BlockingIOError) as exc:
                self.peer_check(f"sending a descriptor to local rank {peer_local_rank}")
                if time.monotonic() > deadline:
                    raise ExchangeTimeout(
                        f"local rank {peer_local_rank} did not accept a descriptor at "
                        f"{self.describe_address(peer_local_rank)} within {self.timeout:g} s"
                    ) from exc
                time.sleep(0.001)
            except TimeoutError as exc:
                raise ExchangeTimeout(
                    f"sending a descriptor to local rank {peer_local_rank} timed out "
                    f"after {self.timeout:g} s") from exc
            except (EOFError, OSError) as exc:
                raise ExchangeError(f"sendmsg(SCM_RIGHTS) to local rank {peer_local_rank}: "
                                    f"{getattr(exc, 'strerror', None) or exc}") from exc
            finally:
                sock.close()

    def receive_fds(self, expected: set[int], sequence: int, *,
                    stop: threading.Event | None = None) -> dict[int, OwnedFd]:
        """Accept one descriptor from each local rank in ``expected`` (until ``stop``
        is set, if given: then what arrived so far).

        Connections from processes that are not the expected ranks are refused and logged.

        Raises:
            ExchangeTimeout: some peers did not send within the timeout (named).
            ExchangeError: a job peer sent a malformed message.
        """
        assert self._listener is not None, "endpoint is closed"
        received: dict[int, OwnedFd] = {}
        deadline = time.monotonic() + self.timeout
        try:
            while len(received) < len(expected) and not (stop and stop.is_set()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(expected - set(received))
                    raise ExchangeTimeout(
                        f"no descriptor from local rank(s) {missing} within {self.timeout:g} s "
                        f"on {self.describe_address(self.local_rank)}")
                self.peer_check("waiting for descriptors")
                # Wake up now and then to ask whether the peers we wait for still live.
                self._listener.settimeout(min(remaining, _LIVENESS_POLL_S))
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    result = self._receive_one(conn, expected, sequence, remaining)
                if result is not None:
                    sender, fd = result
                    if sender in received:  # a duplicate from a job peer: keep the first
                        fd.close()
                    else:
                        received[sender] = fd
        except BaseException:
            for fd in received.values():
                fd.close()
            raise
        return received

    def _mac(self, *parts: bytes) -> bytes:
        return hmac.new(self._secret, b"".join(parts), hashlib.sha256).digest()

    def _header(self, sender: int, sequence: int, nonce: bytes) -> bytes:
        fields = _FIELDS.pack(_MAGIC, self.token.encode(), sender, sequence)
        return _HEADER.pack(fields, nonce, self._mac(fields, nonce))

    def _answer(self, listener: int, nonce: bytes) -> bytes:
        """What local rank ``listener`` answers to a sender's challenge ``nonce``."""
        return self._mac(b"listener", listener.to_bytes(4, "big"), nonce)

    def _refuse(self, pid: int, uid: int, why: str) -> None:
        if (pid, uid) not in self.refused:  # once: a flood must not flood the log too
            log.warning("refused a descriptor-socket connection from pid %d uid %d: %s",
                        pid, uid, why)
        self.refused.append((pid, uid))

    def _receive_one(self, conn: socket.socket, expected: set[int], sequence: int,
                     timeout: float) -> tuple[int, OwnedFd] | None:
        pid, uid, _gid = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        unverifiable = None in self.peer_pids  # some rank's pid means nothing here
        # A connection from a known rank's pid may raise on a malformed message (a job
        # peer is broken); any other is a stranger until its MAC proves otherwise.
        known = uid == self._uid and pid in self.peer_pids
        if uid != self._uid or not (known or unverifiable):
            # Read nothing: descriptors in flight are discarded with the connection.
            self._refuse(pid, uid, "not a rank of this job")
            return None
        conn.settimeout(max(timeout, 0.001))
        owned: list[OwnedFd] = []
        try:
            try:
                data, fds, flags, _ = socket.recv_fds(conn, _HEADER.size, 4)
                owned = [OwnedFd(fd) for fd in fds]
                if flags & getattr(socket, "MSG_CTRUNC", 0x8):
                    raise _Refused(f"descriptor message from pid {pid} was truncated")
                if len(data) != _HEADER.size:
                    raise _Refused(
                        f"malformed descriptor message from pid {pid}: {len(data)} header "
                        f"bytes, {len(owned)} descriptors (expected {_HEADER.size} and 1)")
            except (TimeoutError, OSError) as exc:
                raise _Refused(f"recvmsg from pid {pid} failed: {exc}") from exc
            fields, nonce, mac = _HEADER.unpack(data)
            magic, token, sender, seq = _FIELDS.unpack(fields)
            if sender >= len(self.peer_pids) or not hmac.compare_digest(
                    mac, self._mac(fields, nonce)):
                # Only the job's ranks hold the secret: whatever this is, it is not ours.
                self._refuse(pid, uid, "its message does not carry this job's secret")
                return None
            if magic != _MAGIC or token != self.token.encode():
                raise ExchangeError(
                    f"descriptor message from pid {pid} carries another job's token")
            if self.peer_pids[sender] is not None and self.peer_pids[sender] != pid:
                raise ExchangeError(f"pid {pid} claims to be local rank {sender}, which it is not")
            if nonce != _NO_CHALLENGE:
                # The sender cannot check our pid: prove the secret, then take the
                # descriptor it sends in return.
                if owned:
                    raise ExchangeError(f"local rank {sender} sent a descriptor with its "
                                        "challenge")
                try:
                    conn.sendall(self._answer(self.local_rank, nonce))
                    data, fds, flags, _ = socket.recv_fds(conn, 1, 4)
                except (TimeoutError, OSError) as exc:
                    raise ExchangeError(f"recvmsg from local rank {sender} (pid {pid}) "
                                        f"failed: {exc}") from exc
                owned = [OwnedFd(fd) for fd in fds]
                if data != _DESCRIPTOR_BYTE:
                    raise ExchangeError(f"local rank {sender} sent {len(data)} bytes after "
                                        "its challenge instead of a descriptor")
            if len(owned) != 1:
                raise ExchangeError(f"local rank {sender} (pid {pid}) sent {len(owned)} "
                                    "descriptors, expected 1")
            if seq != sequence:
                log.warning("dropped a stale descriptor from local rank %d (sequence %d, now %d)",
                            sender, seq, sequence)
                owned[0].close()
                return None
            if sender not in expected:
                raise ExchangeError(f"unexpected descriptor from local rank {sender}")
            return sender, owned[0]
        except _Refused as refusal:
            for fd in owned:
                fd.close()
            if known:
                raise ExchangeError(str(refusal)) from refusal
            self._refuse(pid, uid, str(refusal))
            return None
        except BaseException:
            for fd in owned:
                fd.close()
            raise

    def close(self) -> None:
        """Stop listening and remove this rank's socket file (idempotent): only the
        socket it bound, looked up in the checked directory, never what a swapped folder
        or a symlink would put under that path."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        try:
            if self._bound is not None:
                name, device, inode = self._bound
                self._bound = None
                self._remove_own_socket(name, (device, inode))
        finally:
            self._close_directory()

    def _remove_own_socket(self, name: str, identity: tuple[int, int] | None = None) -> None:
        """Unlink socket ``name`` of the checked directory if it is a socket of ours (and
        the very one ``identity`` names, if given)."""
        assert self._directory_fd is not None
        try:
            info = os.stat(name, dir_fd=self._directory_fd, follow_symlinks=False)
            if (stat.S_ISSOCK(info.st_mode) and info.st_uid == self._uid
                    and identity in (None, (info.st_dev, info.st_ino))):
                os.unlink(name, dir_fd=self._directory_fd)
        except FileNotFoundError:
            pass

    def _close_directory(self) -> None:
        if self._directory_fd is not None:
            os.close(self._directory_fd)
            self._directory_fd = None


def _receive_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise EOFError(f"the listener closed the connection after {len(data)} of "
                           f"{count} bytes")
        data += chunk
    return data
