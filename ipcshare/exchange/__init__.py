"""How handles travel between ranks.

Opaque handle bytes go by MPI allgather. Descriptors (memfd, cuMem POSIX-FD) go by
``pidfd_getfd`` when the kernel and its policies allow, or by SCM_RIGHTS over the job's
private unix sockets; ``auto`` tries pidfd first and falls back for good, telling why.
"""

from __future__ import annotations

import os
import secrets

from ..config import seconds_from_env
from ..consensus import agree, collective_step
from ..errors import ConfigError, ExchangeError
from ..logs import get_logger
from ..topology import World
from .fds import OwnedFd
from .pidfd import fetch_fd
from .unix_socket import SocketEndpoint, make_socket_dir, remove_socket_dir

__all__ = ["Exchange", "OwnedFd", "DEFAULT_TIMEOUT_S"]

log = get_logger("exchange")

DEFAULT_TIMEOUT_S = 30.0


def _default_timeout() -> float:
    return seconds_from_env("IPCSHARE_EXCHANGE_TIMEOUT", DEFAULT_TIMEOUT_S)


class Exchange:
    """Moves handle bytes and descriptors between the ranks of one World.

    ``kind`` is ``auto``, ``mpi`` (bytes only: descriptors then go by socket),
    ``socket`` or ``pidfd``. After the first descriptor exchange, ``fd_path`` says which
    path carried them and ``fallback_reason`` why pidfd was not used, if it was not.
    """

    def __init__(self, world: World, kind: str = "auto", *, timeout: float | None = None) -> None:
        if kind not in ("auto", "mpi", "socket", "pidfd"):
            raise ConfigError(f"unknown exchange {kind!r}; choose one of: auto, mpi, socket, pidfd")
        self.world = world
        self.kind = kind
        self.timeout = _default_timeout() if timeout is None else timeout
        self.fd_path: str | None = {"socket": "socket", "mpi": "socket", "pidfd": "pidfd"}.get(kind)
        self.fallback_reason: str | None = None
        self._endpoint: SocketEndpoint | None = None
        self._socket_dir: str | None = None
        self._sequence = 0
        self._closed = False

    @property
    def name(self) -> str:
        """The path descriptors take (``pidfd`` / ``socket``), or ``mpi`` before any."""
        return self.fd_path or "mpi"

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        """Collective: every rank's opaque handle bytes, indexed by rank."""
        return self.world.comm.allgather(bytes(payload))

    def share_bytes(self, payload: bytes) -> dict[int, bytes]:
        """Collective over the node: the opaque handle bytes of every rank of this node,
        keyed by world rank (handles mean nothing on another node, so they stay here)."""
        gathered = self.world.local_comm.allgather(bytes(payload))
        return dict(zip(self.world.local_ranks, gathered, strict=True))

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
            statuses = self.world.comm.allgather(None if error is None else str(error))
            failures = [(r, s) for r, s in enumerate(statuses) if s is not None]
            if not failures:
                self.fd_path = "pidfd"
                return received
            for owned in received.values():
                owned.close()
            rank, reason = failures[0]
            self.fallback_reason = f"pidfd_getfd refused on {self.world.where(rank)}: {reason}"
            log.info("%s; passing descriptors over unix sockets instead", self.fallback_reason)
            self.fd_path = "socket"
            self._sequence += 1
        share = self._share_by_pidfd if self.fd_path == "pidfd" else self._share_by_socket
        received, error = self._try(share, fd)
        try:
            agree(self.world, f"descriptor exchange ({self.fd_path})", error)
        except BaseException:
            for owned in received.values():
                owned.close()
            raise
        return received

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
        numbers = world.local_comm.allgather(fd.fileno())
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
            world.local_comm.Barrier()
        return received

    def _share_by_socket(self, fd: OwnedFd) -> dict[int, OwnedFd]:
        endpoint = self._socket_endpoint()
        world = self.world
        for local, rank in enumerate(world.local_ranks):
            if rank != world.rank:
                endpoint.send_fd(local, fd.fileno(), self._sequence)
        expected = {local for local, rank in enumerate(world.local_ranks) if rank != world.rank}
        by_local = endpoint.receive_fds(expected, self._sequence)
        return {world.local_ranks[local]: owned for local, owned in by_local.items()}

    def _socket_endpoint(self) -> SocketEndpoint:
        """Set up this node's private sockets (collective over the world, once)."""
        if self._endpoint is not None:
            return self._endpoint
        world = self.world
        token = world.comm.bcast(secrets.token_hex(8) if world.rank == 0 else None, root=0)
        directory = make_socket_dir(token) if world.local_rank == 0 else None
        directory = world.local_comm.bcast(directory, root=0)
        self._socket_dir = directory if world.local_rank == 0 else None
        endpoint = None
        try:
            with collective_step(world, "descriptor socket setup"):
                local_pids = [world.pids[r] for r in world.local_ranks]
                endpoint = SocketEndpoint(token=token, directory=directory,
                                          local_rank=world.local_rank, peer_pids=local_pids,
                                          timeout=self.timeout)
        except BaseException:
            if endpoint is not None:
                endpoint.close()
            remove_socket_dir(self._socket_dir)
            self._socket_dir = None
            raise
        self._endpoint = endpoint
        return endpoint

    @property
    def refused_connections(self) -> list[tuple[int, int]]:
        """(pid, uid) of processes whose connections to our socket were refused."""
        return list(self._endpoint.refused) if self._endpoint else []

    def close(self) -> None:
        """Close the socket and remove the node's socket directory (idempotent).

        Collective over the node when sockets were set up, so the directory outlives
        every rank's socket file.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._endpoint is not None:
                self._endpoint.close()
                self._endpoint = None
                self.world.local_comm.Barrier()
        finally:
            remove_socket_dir(self._socket_dir)
            self._socket_dir = None
