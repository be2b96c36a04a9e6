"""Descriptor passing with SCM_RIGHTS over unix sockets that admit only this job's ranks.

Every rank listens on its own socket inside a private (0700) directory whose name carries
a per-job random token; when the path would not fit ``sun_path`` (108 bytes) the socket
goes to the abstract namespace under the same token. A sender connects, sends a small
header and its descriptor in one ``sendmsg``; the receiver checks the connecting process
with SO_PEERCRED (same uid, and the pid of the rank the header claims) before it reads
anything, so a process outside the job never gets a descriptor in or out. A peer in
another PID namespace has no pid that means anything here (SO_PEERCRED reports 0, or its
pid in ours): it is admitted by uid alone, and then its header must carry a MAC of its
fields keyed with the job's secret, which only the job's ranks received (over MPI; the
token in socket names is public, the secret never leaves the job).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import time
from collections.abc import Callable

from ..runtime.errors import ExchangeError, ExchangeTimeout
from ..runtime.logs import get_logger
from ..runtime.owned_fd import OwnedFd

__all__ = ["SocketEndpoint"]

log = get_logger("exchange")

_MAGIC = b"IPCS"
# magic, job token (16 hex chars), sender local rank, sequence number
_FIELDS = struct.Struct("!4s16sIQ")
_MAC_BYTES = 32  # HMAC-SHA256 of the fields under the job's secret
_HEADER = struct.Struct(f"!{_FIELDS.size}s{_MAC_BYTES}s")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_LIVENESS_POLL_S = 0.05


class SocketEndpoint:
    """This rank's listening socket plus what it needs to check its peers."""

    def __init__(self, *, token: str, secret: bytes, directory: str | None, local_rank: int,
                 peer_pids: list[int | None], timeout: float,
                 peer_check: Callable[[str], None] | None = None) -> None:
        """``peer_pids[local rank]`` is that rank's pid as this process sees it, or None
        for a rank in another PID namespace (admitted by uid and the secret's MAC)."""
        self.token = token
        self._secret = secret
        self.directory = directory
        self.local_rank = local_rank
        self.peer_pids = peer_pids
        self.timeout = timeout
        # Raises when a peer died (PeerWatch.check): waits end at once instead of timing out.
        self.peer_check = peer_check or (lambda _doing: None)
        self.refused: list[tuple[int, int]] = []  # (pid, uid) of turned-away connections
        self._sequence = 0
        self._uid = os.getuid()
        self._listener: socket.socket | None = None
        self._bound_path: str | None = None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            address = self.address_of(local_rank)
            listener.bind(address)
            if isinstance(address, str):
                self._bound_path = address
                os.chmod(address, 0o600)
            listener.listen(max(16, 2 * len(peer_pids)))
        except OSError as exc:
            listener.close()
            raise ExchangeError(f"cannot listen on {self.describe_address(local_rank)}: "
                                f"{exc.strerror or exc}") from exc
        self._listener = listener

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

    def send_fd(self, peer_local_rank: int, fd: int, sequence: int) -> None:
        """Push ``fd`` to a peer's socket (the kernel queues it until the peer accepts)."""
        deadline = time.monotonic() + self.timeout
        address = self.address_of(peer_local_rank)
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(address)
                socket.send_fds(sock, [self._header(self.local_rank, sequence)], [fd])
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
            except OSError as exc:
                raise ExchangeError(f"sendmsg(SCM_RIGHTS) to local rank {peer_local_rank}: "
                                    f"{exc.strerror or exc}") from exc
            finally:
                sock.close()

    def receive_fds(self, expected: set[int], sequence: int) -> dict[int, OwnedFd]:
        """Accept one descriptor from each local rank in ``expected``.

        Connections from processes that are not the expected ranks are refused and logged.

        Raises:
            ExchangeTimeout: some peers did not send within the timeout (named).
            ExchangeError: a job peer sent a malformed message.
        """
        assert self._listener is not None, "endpoint is closed"
        received: dict[int, OwnedFd] = {}
        deadline = time.monotonic() + self.timeout
        try:
            while len(received) < len(expected):
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

    def _header(self, sender: int, sequence: int) -> bytes:
        fields = _FIELDS.pack(_MAGIC, self.token.encode(), sender, sequence)
        return _HEADER.pack(fields, hmac.new(self._secret, fields, hashlib.sha256).digest())

    def _refuse(self, pid: int, uid: int, why: str) -> None:
        self.refused.append((pid, uid))
        log.warning("refused a descriptor-socket connection from pid %d uid %d: %s",
                    pid, uid, why)

    def _receive_one(self, conn: socket.socket, expected: set[int], sequence: int,
                     timeout: float) -> tuple[int, OwnedFd] | None:
        pid, uid, _gid = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        unverifiable = None in self.peer_pids  # some rank's pid means nothing here
        if uid != self._uid or (pid not in self.peer_pids and not unverifiable):
            # Read nothing: descriptors in flight are discarded with the connection.
            self._refuse(pid, uid, "not a rank of this job")
            return None
        conn.settimeout(max(timeout, 0.001))
        try:
            data, fds, flags, _ = socket.recv_fds(conn, _HEADER.size, 4)
        except (TimeoutError, OSError) as exc:
            raise ExchangeError(f"recvmsg from pid {pid} failed: {exc}") from exc
        owned = [OwnedFd(fd) for fd in fds]
        try:
            if flags & getattr(socket, "MSG_CTRUNC", 0x8):
                raise ExchangeError(f"descriptor message from pid {pid} was truncated")
            if len(data) != _HEADER.size or len(owned) != 1:
                raise ExchangeError(
                    f"malformed descriptor message from pid {pid}: {len(data)} header bytes, "
                    f"{len(owned)} descriptors (expected {_HEADER.size} and 1)")
            fields, mac = _HEADER.unpack(data)
            magic, token, sender, seq = _FIELDS.unpack(fields)
            if sender >= len(self.peer_pids) or not hmac.compare_digest(
                    mac, self._header(sender, seq)[_FIELDS.size:]):
                # Only the job's ranks hold the secret: whatever this is, it is not ours.
                for fd in owned:
                    fd.close()
                self._refuse(pid, uid, "its message does not carry this job's secret")
                return None
            if magic != _MAGIC or token != self.token.encode():
                raise ExchangeError(
                    f"descriptor message from pid {pid} carries another job's token")
            if self.peer_pids[sender] is not None and self.peer_pids[sender] != pid:
                raise ExchangeError(f"pid {pid} claims to be local rank {sender}, which it is not")
            if seq != sequence:
                log.warning("dropped a stale descriptor from local rank %d (sequence %d, now %d)",
                            sender, seq, sequence)
                for fd in owned:
                    fd.close()
                return None
            if sender not in expected:
                raise ExchangeError(f"unexpected descriptor from local rank {sender}")
            return sender, owned[0]
        except BaseException:
            for fd in owned:
                fd.close()
            raise

    def close(self) -> None:
        """Stop listening and remove this rank's socket file (idempotent)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._bound_path is not None:
            try:
                os.unlink(self._bound_path)
            except FileNotFoundError:
                pass
            self._bound_path = None
