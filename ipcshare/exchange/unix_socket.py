"""Descriptor passing with SCM_RIGHTS over unix sockets that admit only this job's ranks.

Every rank listens on its own socket inside the job's private (0700) directory, whose
name carries a per-job random token; when the path would not fit ``sun_path`` (108
bytes) the socket goes to the abstract namespace under a name that also carries a tag
drawn from the job's secret and the rank, so no one outside the job can bind it first (not
even after reading another rank's name in /proc/net/unix). Both ends
check the other before a descriptor moves:

- every rank announces its listening socket over MPI (the trusted channel): a path
  socket by its (st_dev, st_ino). A sender opens the peer's socket ``O_PATH`` through
  the checked directory's descriptor, compares it with what that rank announced, and
  connects through that very descriptor (``/proc/self/fd/N``): a socket renamed away and
  replaced (by anyone who may write the directory, a process of this user in another
  PID namespace included) is refused, and no rename can race the check;
- the receiver checks the connecting process with SO_PEERCRED (same uid, and the pid of
  the rank the header claims) before it reads anything, and the header's MAC;
- the sender checks the listening process the same way right after ``connect``.

A peer in another PID namespace has no pid that means anything here (SO_PEERCRED reports
0, or its pid in ours): it is admitted by uid, and then by the job's secret, which only
the job's ranks received (over MPI; the token in socket names is public, the secret
never leaves the job). Such a sender sends a header with a fresh nonce; the listener
answers with a fresh nonce of its own and a MAC over the header and both nonces; the
sender checks it and sends the descriptor with a MAC over both nonces. Each proof holds
for one connection only (the other end's fresh nonce is in it), and a header is answered
once: a header replayed from an earlier exchange, or a second time in this one, gets no
answer.

The receiver serves the listening socket and every accepted connection side by side
(``poll``), each connection step with a short deadline of its own: a stranger that is
silent, slow, garbled or replaying is dropped, counted and logged once per process, and
delays nobody. Whatever a connection that is not provably a rank of the job sends is
refused and the exchange carries on.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import hmac
import os
import secrets
import select
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

__all__ = ["SocketEndpoint", "RefusalCounter"]

log = get_logger("exchange")

_MAGIC = b"IPCS"
# magic, job token (16 hex chars), sender local rank, listener local rank, sequence number
_FIELDS = struct.Struct("!4s16sIIQ")
_NONCE_BYTES = 16
_NO_CHALLENGE = bytes(_NONCE_BYTES)  # a sender that checked the listener's pid
_MAC_BYTES = 32  # HMAC-SHA256 under the job's secret
_HEADER = struct.Struct(f"!{_FIELDS.size}s{_NONCE_BYTES}s{_MAC_BYTES}s")
# The listener's answer to a challenge: its own nonce and a MAC over both.
_ANSWER = struct.Struct(f"!{_NONCE_BYTES}s{_MAC_BYTES}s")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_LIVENESS_POLL_S = 0.05
# How long one step of a connection (its header, its proof) may take before the
# connection is dropped: a rank sends each at once, so only a stranger waits that long.
_STEP_S = 2.0
# Connections served at once; beyond, the oldest that has proven nothing is dropped.
_MAX_PENDING = 64
# Nonces of challenges answered, remembered so that none is answered twice.
_REMEMBERED_NONCES = 4096
_ABSTRACT_TAG = b"abstract socket names"


class _Refused(Exception):
    """A connection that is not provably a rank of the job misbehaved: refuse it."""


class _Done(Exception):
    """A connection has nothing more for this exchange (a rank's stale message): close it."""


class RefusalCounter:
    """Connections turned away: a count, the last few (pid, uid), and each process logged
    once (a flood costs memory bounded by ``keep`` and ``log_at_most``)."""

    def __init__(self, *, keep: int = 16, log_at_most: int = 64) -> None:
        self.count = 0
        self.recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=keep)
        self._logged: set[tuple[int, int]] = set()
        self._log_at_most = log_at_most

    def add(self, pid: int, uid: int, why: str) -> None:
        self.count += 1
        self.recent.append((pid, uid))
        if (pid, uid) in self._logged:
            return
        if len(self._logged) < self._log_at_most:
            self._logged.add((pid, uid))
            log.warning("refused a descriptor-socket connection from pid %d uid %d: %s",
                        pid, uid, why)
        elif len(self._logged) == self._log_at_most:
            self._logged.add((-1, -1))
            log.warning("refused connections from more than %d processes; counting the "
                        "rest without naming them", self._log_at_most)

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(self.recent)

    def __contains__(self, item: object) -> bool:
        return item in self.recent

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self.recent[index]


class _Incoming:
    """One accepted connection, read step by step without blocking."""

    def __init__(self, conn: socket.socket, pid: int, uid: int, known: bool,
                 deadline: float) -> None:
        self.conn, self.pid, self.uid, self.known = conn, pid, uid, known
        self.deadline = deadline
        self.data = b""
        self.fds: list[OwnedFd] = []
        self.header: tuple[bytes, int, int, bytes] | None = None  # fields, sender, seq, nonce
        self.listener_nonce: bytes | None = None

    def close(self) -> None:
        for fd in self.fds:
            fd.close()
        self.fds = []
        self.conn.close()


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
        removes only that socket. Before sending, the peers' sockets must be announced
        (``announce``, with every rank's ``listening_identity``).

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
        self.refused = RefusalCounter()
        self._uid = os.getuid()
        self._listener: socket.socket | None = None
        self._bound: tuple[str, int, int] | None = None  # name, st_dev, st_ino
        self._announced: list[tuple[int, int] | None] | None = None
        self._answered: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            address = self.address_of(local_rank)
            listener.bind(address)
            listener.listen(max(_MAX_PENDING, 2 * len(peer_pids)))
            if isinstance(address, str):
                os.chmod(address, 0o600)
                self._bound = self._check_bound(address, listener)
            listener.setblocking(False)
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

    def _check_bound(self, address: str, listener: socket.socket) -> tuple[str, int, int]:
        """Prove that the socket just bound at ``address`` is in the checked directory
        (its folder was not swapped between the check and the bind: only this user can
        create entries there, and this name was not there before) and is this very
        listener's (not one that a process of this user put there after renaming ours
        away): a probe connected through the file's own descriptor must arrive here.
        Returns its name and (st_dev, st_ino), what this rank announces."""
        name = os.path.basename(address)
        assert self._directory_fd is not None
        swapped = ExchangeError(f"the socket bound at {address} is not in the job's socket "
                                "directory: its folder was swapped after it was checked; "
                                "refusing to use it")
        try:
            path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=self._directory_fd)
        except FileNotFoundError:
            raise ExchangeError(f"the socket bound at {address} is gone from the job's socket "
                                "directory: renamed right after the bind, or its folder "
                                "swapped after it was checked; refusing to use it") from None
        try:
            info = os.fstat(path_fd)
            if not stat.S_ISSOCK(info.st_mode) or info.st_uid != self._uid:
                raise swapped
            if not _reaches(listener, path_fd, min(self.timeout, _STEP_S)):
                raise ExchangeError(f"the socket at {address} is not the one this rank bound: "
                                    "it was replaced right after the bind; refusing to "
                                    "announce it")
        finally:
            os.close(path_fd)
        return name, info.st_dev, info.st_ino

    @property
    def namespace(self) -> str:
        """``'path'`` for sockets in the private directory, ``'abstract'`` otherwise."""
        return "path" if self.directory else "abstract"

    @property
    def listening_identity(self) -> tuple[int, int] | None:
        """(st_dev, st_ino) of this rank's socket file, what peers connect to alone; None
        for an abstract socket (whose name carries the job's secret tag instead)."""
        return None if self._bound is None else (self._bound[1], self._bound[2])

    def announce(self, identities: list[tuple[int, int] | None]) -> None:
        """Take every local rank's ``listening_identity``, as received over MPI."""
        self._announced = [None if i is None else (int(i[0]), int(i[1])) for i in identities]

    def address_of(self, local_rank: int) -> str | bytes:
        if self.directory:
            return os.path.join(self.directory, f"r{local_rank}.sock")
        # A tag per rank: a name seen in /proc/net/unix tells nothing of the others'.
        tag = hmac.new(self._secret, _ABSTRACT_TAG + local_rank.to_bytes(4, "big"),
                       hashlib.sha256).hexdigest()[:16]
        return f"\0ipcshare-{self.token}-{tag}-r{local_rank}".encode()

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

    # -- sending ---------------------------------------------------------------------

    def send_fd(self, peer_local_rank: int, fd: int, sequence: int) -> None:
        """Push ``fd`` to a peer's socket, once the listener there is proven to be that
        peer (the kernel queues it until the peer accepts).

        Raises:
            ExchangeError: the socket is not the one the peer announced, or is held by
                a process that is not that rank.
            ExchangeTimeout: the peer did not listen, or did not answer, in time.
        """
        deadline = time.monotonic() + self.timeout
        where = f"local rank {peer_local_rank} at {self.describe_address(peer_local_rank)}"
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                with self._connect(peer_local_rank, where, remaining) as sock:
                    self._push(sock, peer_local_rank, where, fd, sequence, deadline)
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

    def _connect(self, peer: int, where: str, timeout: float) -> socket.socket:
        """A connection to the socket ``peer`` announced: for a path socket, the very
        inode, opened through the checked directory and connected to through its
        descriptor, so neither a rename nor a symlink can put another listener there.

        Raises:
            ExchangeError: the socket there is not the one the peer announced.
            OSError: as ``connect`` (the caller retries those that mean "not yet").
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            address = self.address_of(peer)
            if isinstance(address, bytes):
                sock.connect(address)
                return sock
            announced = None if self._announced is None else self._announced[peer]
            if announced is None:
                raise ExchangeError(f"the socket of {where} was never announced over MPI: "
                                    "no descriptor sent to it")
            assert self._directory_fd is not None
            try:
                path_fd = os.open(os.path.basename(address),
                                  os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  dir_fd=self._directory_fd)
            except FileNotFoundError as exc:
                raise ExchangeError(f"the socket of {where} is gone (renamed or removed "
                                    "after that rank announced it): no descriptor sent") from exc
            try:
                info = os.fstat(path_fd)
                if not stat.S_ISSOCK(info.st_mode) or (info.st_dev, info.st_ino) != announced:
                    raise ExchangeError(
                        f"the socket of {where} is not the one that rank announced (inode "
                        f"{info.st_ino}, announced {announced[1]}): it was replaced; no "
                        "descriptor sent to it")
                try:
                    sock.connect(f"/proc/self/fd/{path_fd}")
                except FileNotFoundError as exc:
                    if not os.path.isdir("/proc/self/fd"):
                        raise ExchangeError(
                            f"cannot connect to the checked socket of {where}: /proc is not "
                            "mounted here (the socket exchange connects through "
                            "/proc/self/fd so that no rename can swap the socket)") from exc
                    raise
            finally:
                os.close(path_fd)
            return sock
        except BaseException:
            sock.close()
            raise

    def _push(self, sock: socket.socket, peer: int, where: str, fd: int, sequence: int,
              deadline: float) -> None:
        """Check who listens on ``sock`` and hand it ``fd`` (after the challenge, where
        its pid cannot be checked)."""
        expected_pid = self.peer_pids[peer]
        pid, uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if uid != self._uid or (expected_pid is not None and pid != expected_pid):
            raise ExchangeError(
                f"the socket of {where} is held by pid {pid} uid {uid}, not by that "
                "rank (pid " + ("?" if expected_pid is None else str(expected_pid))
                + f" uid {self._uid}): no descriptor sent to it")
        fields = _FIELDS.pack(_MAGIC, self.token.encode(), self.local_rank, peer, sequence)
        if expected_pid is not None:
            socket.send_fds(sock, [self._header(fields, _NO_CHALLENGE)], [fd])
            return
        # Its pid means nothing here: it must prove the job's secret on this connection.
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sock.sendall(self._header(fields, nonce))
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        theirs, mac = _ANSWER.unpack(_receive_exactly(sock, _ANSWER.size))
        if not hmac.compare_digest(mac, self._mac(b"listener", fields, nonce, theirs)):
            raise ExchangeError(f"the listener of {where} (pid {pid} uid {uid}) does not "
                                "prove this job's secret: no descriptor sent to it")
        socket.send_fds(sock, [self._mac(b"sender", fields, nonce, theirs)], [fd])

    # -- receiving -------------------------------------------------------------------

    def receive_fds(self, expected: set[int], sequence: int, *,
                    stop: threading.Event | None = None) -> dict[int, OwnedFd]:
        """Accept one descriptor from each local rank in ``expected`` (until ``stop``
        is set, if given: then what arrived so far).

        Connections are served side by side: one from a process that is not an expected
        rank is refused and logged, and delays no other.

        Raises:
            ExchangeTimeout: some peers did not send within the timeout (named).
            ExchangeError: a job peer sent a malformed message.
        """
        assert self._listener is not None, "endpoint is closed"
        listener = self._listener
        received: dict[int, OwnedFd] = {}
        pending: dict[int, _Incoming] = {}
        poller = select.poll()
        poller.register(listener.fileno(), select.POLLIN)
        deadline = time.monotonic() + self.timeout
        try:
            while len(received) < len(expected) and not (stop and stop.is_set()):
                now = time.monotonic()
                if now >= deadline:
                    missing = sorted(expected - set(received))
                    raise ExchangeTimeout(
                        f"no descriptor from local rank(s) {missing} within {self.timeout:g} s "
                        f"on {self.describe_address(self.local_rank)}")
                self.peer_check("waiting for descriptors")
                for key, incoming in list(pending.items()):
                    if now >= incoming.deadline:
                        self._drop(pending, poller, key, _Refused(
                            f"sent nothing for {_STEP_S:g} s (a step of the exchange)"))
                wake = min([deadline, now + _LIVENESS_POLL_S]
                           + [incoming.deadline for incoming in pending.values()])
                events = poller.poll(max(0.0, wake - now) * 1000)
                for key, _mask in events:
                    if key == listener.fileno():
                        self._accept_all(pending, poller, sequence)
                        continue
                    incoming = pending.get(key)
                    if incoming is None:
                        continue
                    try:
                        result = self._advance(incoming, expected, received, sequence)
                    except _Refused as refusal:
                        self._drop(pending, poller, key, refusal)
                        continue
                    except _Done:
                        self._drop(pending, poller, key, None)
                        continue
                    except BaseException:
                        self._drop(pending, poller, key, None)
                        raise
                    if result is not None:
                        self._drop(pending, poller, key, None)
                        sender, owned = result
                        received[sender] = owned
        except BaseException:
            for fd in received.values():
                fd.close()
            raise
        finally:
            for key, incoming in list(pending.items()):
                # Every expected rank delivered (or this rank gives up): whoever is still
                # connected proved nothing in time.
                self._drop(pending, poller, key, None if incoming.known else _Refused(
                    "it had proven nothing when the exchange ended"))
        return received

    def _accept_all(self, pending: dict[int, _Incoming], poller, sequence: int) -> None:
        """Accept every connection waiting; refuse at once those of another user, or of
        a pid that is no rank where every rank's pid is known."""
        assert self._listener is not None
        unverifiable = None in self.peer_pids  # some rank's pid means nothing here
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("cannot accept a descriptor-socket connection: %s", exc)
                    return
                raise
            pid, uid, _gid = _PEERCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            # A connection from a known rank's pid may raise on a malformed message (a
            # job peer is broken); any other is a stranger until its MAC proves otherwise.
            known = uid == self._uid and pid in self.peer_pids
            if uid != self._uid or not (known or unverifiable):
                # Read nothing: descriptors in flight are discarded with the connection.
                self.refused.add(pid, uid, "not a rank of this job")
                conn.close()
                continue
            conn.setblocking(False)
            if len(pending) >= _MAX_PENDING:
                oldest = next((k for k, i in pending.items() if not i.known), None)
                if oldest is not None:
                    self._drop(pending, poller, oldest, _Refused(
                        f"more than {_MAX_PENDING} connections at once"))
            incoming = _Incoming(conn, pid, uid, known, time.monotonic() + min(
                _STEP_S, self.timeout))
            pending[conn.fileno()] = incoming
            poller.register(conn.fileno(), select.POLLIN)

    def _drop(self, pending: dict[int, _Incoming], poller, key: int,
              refusal: _Refused | None) -> None:
        """Close a connection; count and log it as refused when ``refusal`` says why (a
        known rank's broken message raises instead)."""
        incoming = pending.pop(key)
        try:
            poller.unregister(key)
        except (KeyError, ValueError):
            pass
        incoming.close()
        if refusal is None:
            return
        if incoming.known:
            raise ExchangeError(f"descriptor message from pid {incoming.pid}: {refusal}")
        self.refused.add(incoming.pid, incoming.uid, str(refusal))

    def _read(self, incoming: _Incoming, size: int) -> bool:
        """Read what has arrived, up to ``size`` bytes in all; whether they are in."""
        want = size - len(incoming.data)
        try:
            data, fds, flags, _ = socket.recv_fds(incoming.conn, want, 4, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise _Refused(f"recvmsg failed: {exc}") from exc
        incoming.fds.extend(OwnedFd(fd) for fd in fds)
        if flags & getattr(socket, "MSG_CTRUNC", 0x8):
            raise _Refused("its descriptor message was truncated")
        if not data:
            raise _Refused(f"closed the connection after {len(incoming.data)} of {size} bytes "
                           f"({len(incoming.fds)} descriptors)")
        incoming.data += data
        return len(incoming.data) == size

    def _advance(self, incoming: _Incoming, expected: set[int], received: dict[int, OwnedFd],
                 sequence: int) -> tuple[int, OwnedFd] | None:
        """Take what ``incoming`` sent so far; the sender and its descriptor once it
        delivered one, None while it has more to send.

        Raises:
            _Refused: the connection is not provably a rank of the job, or replays.
            ExchangeError: a known rank sent a malformed message.
        """
        if incoming.header is None:
            if not self._read(incoming, _HEADER.size):
                return None
            return self._take_header(incoming, expected, received, sequence)
        if not self._read(incoming, _MAC_BYTES):
            return None
        fields, sender, _seq, nonce = incoming.header
        assert incoming.listener_nonce is not None
        if not hmac.compare_digest(incoming.data, self._mac(b"sender", fields, nonce,
                                                            incoming.listener_nonce)):
            raise _Refused("its proof does not carry this job's secret for this connection")
        return self._one_descriptor(incoming, sender)

    def _take_header(self, incoming: _Incoming, expected: set[int],
                     received: dict[int, OwnedFd], sequence: int
                     ) -> tuple[int, OwnedFd] | None:
        fields, nonce, mac = _HEADER.unpack(incoming.data)
        pid = incoming.pid
        magic, token, sender, listener, seq = _FIELDS.unpack(fields)
        if not hmac.compare_digest(mac, self._mac(b"header", fields, nonce)):
            # Only the job's ranks hold the secret: whatever this is, it is not ours.
            raise _Refused("its message does not carry this job's secret")
        if (magic != _MAGIC or token != self.token.encode() or listener != self.local_rank
                or sender >= len(self.peer_pids)):
            raise _Refused("its header is for another socket")
        claimed_pid = self.peer_pids[sender]
        if claimed_pid is not None and claimed_pid != pid:
            if incoming.known:
                raise ExchangeError(f"pid {pid} claims to be local rank {sender}, which it is not")
            raise _Refused(f"it claims to be local rank {sender}, which it is not")
        if seq != sequence or sender in received or sender not in expected:
            if incoming.known:
                if seq != sequence:
                    log.warning("dropped a stale descriptor from local rank %d (sequence %d, "
                                "now %d)", sender, seq, sequence)
                    raise _Done
                raise ExchangeError(f"unexpected descriptor from local rank {sender}")
            raise _Refused(f"it replays local rank {sender}'s header of exchange {seq} "
                           f"(this is exchange {sequence})")
        if nonce == _NO_CHALLENGE:
            if claimed_pid is None:  # unchallenged only where its pid was checked
                raise _Refused(f"it claims to be local rank {sender} without a challenge")
            return self._one_descriptor(incoming, sender)
        if incoming.fds:
            if incoming.known:
                raise ExchangeError(f"local rank {sender} sent a descriptor with its challenge")
            raise _Refused("it sent a descriptor with its challenge")
        if nonce in self._answered:
            raise _Refused("it replays a header already answered")
        self._answered[nonce] = None
        while len(self._answered) > _REMEMBERED_NONCES:
            self._answered.popitem(last=False)
        ours = secrets.token_bytes(_NONCE_BYTES)
        answer = _ANSWER.pack(ours, self._mac(b"listener", fields, nonce, ours))
        try:
            sent = incoming.conn.send(answer)
        except OSError as exc:
            raise _Refused(f"cannot answer its challenge: {exc}") from exc
        if sent != len(answer):
            raise _Refused("cannot answer its challenge: its socket is full")
        incoming.header = (fields, sender, seq, nonce)
        incoming.listener_nonce = ours
        incoming.data = b""
        incoming.deadline = time.monotonic() + min(_STEP_S, self.timeout)
        return None

    @staticmethod
    def _one_descriptor(incoming: _Incoming, sender: int) -> tuple[int, OwnedFd]:
        if len(incoming.fds) != 1:
            if incoming.known:
                raise ExchangeError(f"local rank {sender} (pid {incoming.pid}) sent "
                                    f"{len(incoming.fds)} descriptors, expected 1")
            raise _Refused(f"it sent {len(incoming.fds)} descriptors, expected 1")
        owned = incoming.fds.pop()
        return sender, owned

    def _mac(self, purpose: bytes, *parts: bytes) -> bytes:
        return hmac.new(self._secret, b"\0".join((purpose, *parts)), hashlib.sha256).digest()

    def _header(self, fields: bytes, nonce: bytes) -> bytes:
        return _HEADER.pack(fields, nonce, self._mac(b"header", fields, nonce))

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


def _reaches(listener: socket.socket, path_fd: int, timeout: float) -> bool:
    """Whether a connection through socket file ``path_fd`` arrives at ``listener`` (a
    blocking listening socket of this process) directly, not passed on by another
    process."""
    probe_bytes = secrets.token_bytes(_NONCE_BYTES)
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(f"/proc/self/fd/{path_fd}")
            probe.sendall(probe_bytes)
        except OSError:
            return False
        while (remaining := deadline - time.monotonic()) > 0:
            if not select.select([listener], [], [], remaining)[0]:
                return False
            conn, _ = listener.accept()
            with conn:
                # Straight from this process: a relay bound there would pass the probe's
                # bytes on to us, but from a connection of its own (its pid, not ours).
                pid, _uid, _gid = _PEERCRED.unpack(
                    conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
                if pid != os.getpid():
                    continue
                conn.settimeout(max(deadline - time.monotonic(), 0.001))
                try:
                    if _receive_exactly(conn, len(probe_bytes)) == probe_bytes:
                        return True
                except (EOFError, OSError):
                    pass  # someone else's connection: not our probe
    return False


def _receive_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise EOFError(f"the listener closed the connection after {len(data)} of "
                           f"{count} bytes")
        data += chunk
    return data
