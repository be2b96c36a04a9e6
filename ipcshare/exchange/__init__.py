"""How handles travel between ranks.

Opaque handle bytes go by MPI allgather. Descriptors (memfd, cuMem POSIX-FD) go by
``pidfd_getfd`` when the kernel and its policies allow, or by SCM_RIGHTS over the job's
private unix sockets; ``auto`` tries pidfd first and falls back for good, telling why.
"""

from __future__ import annotations

import os
import secrets

from ..liveness.consensus import agree, collective_step
from ..liveness.deadline_waits import watched_allgather, watched_barrier
from ..liveness.pidfd_watch import PeerWatch
from ..runtime import settings
from ..runtime.errors import ConfigError, ExchangeError, PeerDied, errno_name_of
from ..runtime.logs import get_logger
from ..runtime.owned_fd import OwnedFd
from ..topology.world import World, format_ranks
from .envelope import open_sealed, seal
from .node_reach import (
    PID_NAMESPACE_FIX,
    ProcessIdentity,
    grouped_by,
    layout,
    no_shared_socket_place,
    unreachable_users,
)
from .pidfd import fetch_fd
from .pidfd_refusal import PidfdRefusal
from .socket_dir import (
    check_socket_dir_setting,
    make_socket_dir,
    open_socket_dir,
    remove_socket_dir,
)
from .unix_socket import SocketEndpoint

__all__ = ["Exchange", "OwnedFd", "DEFAULT_TIMEOUT_S"]

log = get_logger("exchange")

DEFAULT_TIMEOUT_S = settings.DEFAULT_EXCHANGE_TIMEOUT_S


def _default_timeout() -> float:
    return settings.exchange_timeout()


class Exchange:
    """Moves handle bytes and descriptors between the ranks of one World.

    ``kind`` is ``auto``, ``mpi`` (bytes only: descriptors then go by socket),
    ``socket`` or ``pidfd``. After the first descriptor exchange, ``fd_path`` says which
    path carried them and ``fallback_reason`` why pidfd was not used, if it was not
    (``pidfd_refusal``: the same as a typed fact, the refused rank and its errno).

    ``token`` is the job's random token (the same on every rank; drawn by rank 0 on first
    use when not given): handles and socket names carry it. With a ``watch``, every wait
    on a peer gives up when that peer dies (PeerDied) or after ``timeout``.
    """

    def __init__(self, world: World, kind: str = "auto", *, timeout: float | None = None,
                 token: str | None = None, watch: PeerWatch | None = None) -> None:
        if kind not in ("auto", "mpi", "socket", "pidfd"):
            raise ConfigError(f"unknown exchange {kind!r}; choose one of: auto, mpi, socket, pidfd")
        self.world = world
        self.kind = kind
        self.timeout = _default_timeout() if timeout is None else timeout
        self.fd_path: str | None = {"socket": "socket", "mpi": "socket", "pidfd": "pidfd"}.get(kind)
        self.fallback_reason: str | None = None
        self.pidfd_refusal: PidfdRefusal | None = None
        self._endpoint: SocketEndpoint | None = None
        self._socket_dir: str | None = None
        self._node_socket_dir: str | None = None  # known to every rank of the node
        self._sequence = 0
        self._handle_sequence = 0
        self._token = token
        self._secret: bytes | None = None
        self._identities: list[ProcessIdentity] | None = None
        self.watch = watch
        self._closed = False

    @property
    def name(self) -> str:
        """The path descriptors take (``pidfd`` / ``socket``), or ``mpi`` before any."""
        return self.fd_path or "mpi"

    @property
    def token(self) -> str:
        """The job's random token, 16 hex digits (collective on first use). Public: it
        names the job's sockets and tags its handles."""
        if self._token is None:
            self._token = self.world.comm.bcast(
                secrets.token_hex(8) if self.world.rank == 0 else None, root=0)
        return self._token

    def adopt_token(self, token: str) -> None:
        """Take ``token`` (16 hex digits, the same on every rank: a group agrees on one
        while it sets up) as the job's, before any handle or socket is named by it."""
        self._token = token

    def _job_secret(self) -> bytes:
        """The job's secret (collective over the node on first use): keys the MAC that
        admits socket peers whose pid cannot be checked. Travels only over MPI."""
        if self._secret is None:
            self._secret = self.world.local_comm.bcast(
                secrets.token_bytes(32) if self.world.local_rank == 0 else None, root=0)
        return self._secret

    def _node_identities(self) -> list[ProcessIdentity]:
        """Every local rank's uid and namespaces, by local rank (collective over the node
        on first use)."""
        if self._identities is None:
            self._identities = self._allgather(self.world.local_comm,
                                               ProcessIdentity.of_this_process(),
                                               "descriptor path setup")
        return self._identities

    def pid_namespace_layout(self) -> str | None:
        """Collective over the node on first use: the node's PID-namespace layout
        (``'rank 0 in pid:[…]; rank 1 in pid:[…]'``) when its ranks are not all in one,
        else None."""
        return self._pid_namespaces_differ()

    def _pid_namespaces_differ(self) -> str | None:
        """The node's PID-namespace layout when its ranks are not all in one, else None."""
        identities = self._node_identities()
        spaces = grouped_by([i.pid_namespace for i in identities], self.world.local_ranks)
        return layout(spaces, "in") if len(spaces) > 1 else None

    def allgather_bytes(self, payload: bytes, *, kind: str = "opaque") -> list[bytes]:
        """Collective: every rank's handle bytes, indexed by rank, each checked.

        Handles travel sealed (see ``envelope``): a truncated, corrupted, foreign
        (another job's, another backend's) or stale handle never reaches a backend.

        Raises:
            ExchangeError: on the ranks that received a bad handle (naming the sender).
            PeerDied / ExchangeTimeout: a rank died or did not come (with a watch).
        """
        gathered = self._gather_sealed(self.world.comm, range(self.world.size), payload, kind)
        return list(gathered.values())

    def _allgather(self, comm, value, what: str) -> list:
        if self.watch is None:
            return comm.allgather(value)
        return watched_allgather(comm, value, watch=self.watch, timeout=self.timeout,
                                 what=what)

    def _barrier(self, comm, what: str) -> None:
        if self.watch is None:
            comm.Barrier()
        else:
            watched_barrier(comm, watch=self.watch, timeout=self.timeout, what=what)

    def share_bytes(self, payload: bytes, *, kind: str = "opaque") -> dict[int, bytes]:
        """Collective over the node: the handle bytes of every rank of this node, keyed by
        world rank (handles mean nothing on another node, so they stay here), sealed and
        checked like ``allgather_bytes``.

        Raises:
            ExchangeError: on the ranks that received a bad handle (naming the sender).
            PeerDied / ExchangeTimeout: a rank died or did not come (with a watch).
        """
        return self._gather_sealed(self.world.local_comm, self.world.local_ranks, payload, kind)

    def _gather_sealed(self, comm, ranks, payload: bytes, kind: str) -> dict[int, bytes]:
        """Seal ``payload``, all-gather it over ``comm`` (whose members are world ``ranks``,
        in order) and open what every rank sent, keyed by world rank."""
        world, token = self.world, self.token
        self._handle_sequence += 1
        sealed = seal(payload, kind=kind, token=token, rank=world.rank,
                      sequence=self._handle_sequence)
        gathered = self._allgather(comm, sealed, "handle exchange")
        return {rank: open_sealed(data, kind=kind, token=token, sender=rank,
                                  sequence=self._handle_sequence, sender_name=world.where(rank))
                for rank, data in zip(ranks, gathered, strict=True)}

    def share_fds(self, fd: OwnedFd) -> dict[int, OwnedFd]:
        """Collective over the node: a descriptor from every other local rank.

        Returns ``{world rank: OwnedFd}`` for the other ranks of this node; the caller
        owns and must close them. Every rank of the node raises if any failed.

        Raises:
            ExchangeError / ExchangeTimeout: on every rank, naming the failing one.
        """
        if self._closed:
            raise ExchangeError("exchange is closed")
        self._sequence += 1
        if self.fd_path is None:  # auto, first time: try pidfd, agree, maybe fall back
            received, error = self._try(self._share_by_pidfd, fd)
            if self.watch is not None and self.watch.failed:
                for owned in received.values():
                    owned.close()
                self._raise_in_failed_group(error, "descriptor exchange (pidfd)")
            statuses = self._allgather(
                self.world.comm, None if error is None else (str(error), errno_name_of(error)),
                "descriptor exchange (pidfd)")
            failures = [(r, s) for r, s in enumerate(statuses) if s is not None]
            if not failures:
                self.fd_path = "pidfd"
                return received
            for owned in received.values():
                owned.close()
            rank, (reason, errno_name) = failures[0]
            self.pidfd_refusal = PidfdRefusal(rank, errno_name, reason)
            self.fallback_reason = f"pidfd_getfd refused on {self.world.where(rank)}: {reason}"
            log.info("%s; passing descriptors over unix sockets instead", self.fallback_reason)
            self.fd_path = "socket"
            self._sequence += 1
        share = self._share_by_pidfd if self.fd_path == "pidfd" else self._share_by_socket
        received, error = self._try(share, fd)
        try:
            if error is not None and self.watch is not None and self.watch.failed:
                self._raise_in_failed_group(error, f"descriptor exchange ({self.fd_path})")
            agree(self.world, f"descriptor exchange ({self.fd_path})", error, watch=self.watch,
                  timeout=self.timeout)
        except BaseException:
            for owned in received.values():
                owned.close()
            raise
        return received

    def _raise_in_failed_group(self, error: BaseException | None, doing: str) -> None:
        """The group failed meanwhile (a peer died, a collective was abandoned): there is
        nothing to agree on, so raise ``error`` here, or the death where a watched peer
        died: whatever this rank ran into meanwhile (a peer's socket that a survivor's
        cleanup removed, a refused connection) follows from it, and the death is what
        every survivor must name (it was "the socket ... is gone" on a slow survivor).

        Raises:
            PeerDied: a watched peer died.
            ExchangeError: the group failed otherwise, and this rank's part went well.
            the error: otherwise.
        """
        assert self.watch is not None
        if self.watch.dead_ranks and not isinstance(error, PeerDied):
            raise PeerDied(self.watch.describe(doing)) from error
        if error is None:
            raise ExchangeError(f"{doing}: this group can no longer meet: {self.watch.failed}")
        raise error

    def warm_up(self) -> None:
        """Collective, like ``share_fds``: pass one throwaway descriptor from every rank
        to its node's peers and close what arrives.

        The first descriptor a process fetches from each peer costs milliseconds (about
        5 ms per peer on the H200 nodes, against microseconds afterwards), and auto mode
        settles its path (pidfd or socket) on first use. Paying both at group setup keeps
        them out of the first window, the one users time.

        Raises:
            ExchangeError / ExchangeTimeout: on every rank, naming the failing one.
        """
        throwaway = OwnedFd(os.memfd_create("ipcshare-warm-up", os.MFD_CLOEXEC))
        try:
            for owned in self.share_fds(throwaway).values():
                owned.close()
        finally:
            throwaway.close()

    @staticmethod
    def _try(share, fd: OwnedFd) -> tuple[dict[int, OwnedFd], BaseException | None]:
        try:
            return share(fd), None
        except Exception as exc:
            return {}, exc

    def _share_by_pidfd(self, fd: OwnedFd) -> dict[int, OwnedFd]:
        world = self.world
        # The same facts on every rank of the node: all raise alike, before any pidfd.
        separated = self._pid_namespaces_differ()
        if separated:
            raise ExchangeError(f"ranks of this node are in different PID namespaces "
                                f"({separated}): a peer's pid means another process here; "
                                f"use the socket exchange, or {PID_NAMESPACE_FIX}")
        numbers = self._allgather(world.local_comm, fd.fileno(), "descriptor exchange (pidfd)")
        received: dict[int, OwnedFd] = {}
        try:
            for local, rank in enumerate(world.local_ranks):
                if rank != world.rank:
                    received[rank] = fetch_fd(world.pids[rank], numbers[local])
        except BaseException:
            for owned in received.values():
                owned.close()
            raise
        finally:
            # The owners must keep their descriptors open until every peer has taken one.
            if self.watch is None or not self.watch.failed:
                self._barrier(world.local_comm, "descriptor exchange (pidfd)")
        return received

    def _share_by_socket(self, fd: OwnedFd) -> dict[int, OwnedFd]:
        users = unreachable_users(self._node_identities(), self.world.local_ranks)
        if users:
            raise ExchangeError(users)  # on every rank of the node: the same facts
        endpoint = self._socket_endpoint()
        world = self.world
        peers = [local for local, rank in enumerate(world.local_ranks) if rank != world.rank]
        by_local = endpoint.share(fd.fileno(), peers, self._sequence)
        return {world.local_ranks[local]: owned for local, owned in by_local.items()}

    def _socket_endpoint(self) -> SocketEndpoint:
        """Set up this node's private sockets (collective over the world, once)."""
        if self._endpoint is not None:
            return self._endpoint
        world = self.world
        token = self.token
        secret = self._job_secret()
        identities = self._node_identities()
        with collective_step(world, "checking the socket directory", watch=self.watch,
                             timeout=self.timeout):
            check_socket_dir_setting()
        directory = make_socket_dir(token) if world.local_rank == 0 else None
        self._socket_dir = directory  # owned by local rank 0 from here on, even on failure
        try:
            directory, identity = self._common_socket_dir(directory, identities)
        except BaseException:
            remove_socket_dir(self._socket_dir, token)
            self._socket_dir = None
            raise
        if directory is None and self._socket_dir is not None:
            remove_socket_dir(self._socket_dir, token)  # some rank cannot see it
            self._socket_dir = None
        self._node_socket_dir = directory
        endpoint = None
        try:
            with collective_step(world, "descriptor socket setup", watch=self.watch,
                                 timeout=self.timeout):
                mine = identities[world.local_rank].pid_namespace
                # A pid from another PID namespace names another process here (or none).
                local_pids = [world.pids[r] if identity.pid_namespace == mine else None
                              for r, identity in zip(world.local_ranks, identities,
                                                     strict=True)]
                peer_check = None if self.watch is None else self.watch.check
                endpoint = SocketEndpoint(token=token, secret=secret, directory=directory,
                                          local_rank=world.local_rank, peer_pids=local_pids,
                                          timeout=self.timeout, peer_check=peer_check,
                                          identity=identity)
        except BaseException:
            if endpoint is not None:
                endpoint.close()
            remove_socket_dir(self._socket_dir, token)
            self._socket_dir = None
            raise
        # Every rank's socket, announced over MPI: a sender connects to that very one.
        try:
            endpoint.announce(self._allgather(world.local_comm, endpoint.listening_identity,
                                              "descriptor socket setup"))
        except BaseException:
            endpoint.close()
            remove_socket_dir(self._socket_dir, token)
            self._socket_dir = None
            raise
        self._endpoint = endpoint
        if self.watch is not None and directory is not None:
            # A rank forced out of a stuck call still gets the node's directory removed.
            self.watch.remove_on_forced_exit(directory, token)
        return endpoint

    def _common_socket_dir(self, directory: str | None, identities: list[ProcessIdentity]
                           ) -> tuple[str | None, tuple[int, int] | None]:
        """Collective over the node: local rank 0's socket directory and its (st_dev,
        st_ino) if every rank sees that very directory (opened and checked:
        ``open_socket_dir``), (None, None) for abstract sockets when some rank cannot
        (another mount namespace, or a directory swapped under its path) but all share a
        network namespace.

        Raises:
            ExchangeError: on every rank of the node, when neither joins them.
        """
        world = self.world
        where = None
        if directory is not None:
            info = os.stat(directory)
            where = (directory, info.st_dev, info.st_ino)
        where = self._allgather(world.local_comm, where, "descriptor socket setup")[0]
        if where is None:
            return None, None  # no base short enough for sun_path: abstract names
        identity = (where[1], where[2])
        try:
            os.close(open_socket_dir(where[0], identity=identity))
            sees = True
        except ExchangeError as exc:
            log.info("%s", exc)
            sees = False
        seen = self._allgather(world.local_comm, sees, "descriptor socket setup")
        blind = [rank for rank, ok in zip(world.local_ranks, seen, strict=True) if not ok]
        if not blind:
            return where[0], identity
        cause = no_shared_socket_place(identities, world.local_ranks, blind, where[0])
        if cause:
            raise ExchangeError(cause)
        log.info("%s cannot see %s: abstract unix sockets instead", format_ranks(blind),
                 where[0])
        return None, None

    @property
    def refused_connections(self) -> list[tuple[int, int]]:
        """(pid, uid) of the last few processes whose connections to our socket were
        refused (``refused_count`` counts them all)."""
        return list(self._endpoint.refused) if self._endpoint else []

    @property
    def refused_count(self) -> int:
        """How many connections to our socket were refused."""
        return self._endpoint.refused.count if self._endpoint else 0

    def close(self) -> None:
        """Close the socket and remove the node's socket directory (idempotent).

        Collective over the node when sockets were set up, so the directory outlives
        every rank's socket file.
        """
        if self._closed:
            return
        self._closed = True
        failed = self.watch is not None and self.watch.failed
        try:
            if self._endpoint is not None:
                self._endpoint.close()
                self._endpoint = None
                if not failed:
                    self._barrier(self.world.local_comm, "closing the descriptor sockets")
        finally:
            # After a failure the rank that made the directory may be the dead one: any
            # survivor removes it (removal is idempotent).
            remove_socket_dir(self._node_socket_dir if failed or (
                self.watch is not None and self.watch.failed) else self._socket_dir,
                self._token or "")
            self._socket_dir = self._node_socket_dir = None
