"""Who is where: world communicator, node-local communicator, local rank, node count."""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any

from .logs import configure_logging

__all__ = ["World", "mpi"]


def mpi() -> Any:
    """Import and return ``mpi4py.MPI`` (initialises MPI on first use)."""
    from mpi4py import MPI  # heavy: MPI_Init happens here, never at ipcshare import

    return MPI


@dataclasses.dataclass
class World:
    """The ranks of one job as ipcshare sees them.

    ``comm`` is the communicator the user gave (COMM_WORLD by default); ``local_comm``
    holds the ranks of this node (``Split_type(COMM_TYPE_SHARED)``), the only ones whose
    memory this rank can map.
    """

    comm: Any
    local_comm: Any
    rank: int
    size: int
    local_rank: int
    local_size: int
    node_index: int
    node_count: int
    hostname: str
    hostnames: list[str]
    pids: list[int]
    node_of_rank: list[int]
    local_ranks: list[int]  # world ranks on this node, ordered by local rank
    _owns_local_comm: bool = True

    @classmethod
    def from_comm(cls, comm: Any = None) -> World:
        """Collective over ``comm``: split it into nodes and learn every rank's place."""
        MPI = mpi()
        comm = MPI.COMM_WORLD if comm is None else comm
        rank, size = comm.Get_rank(), comm.Get_size()
        # Logs name the job's rank, also for groups over a sub-communicator.
        configure_logging(MPI.COMM_WORLD.Get_rank())
        local_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        hostname = socket.gethostname()
        # Rank of each node's first member names the node; order nodes by it.
        leader = local_comm.allreduce(rank, op=MPI.MIN)
        facts = comm.allgather((hostname, os.getpid(), leader))
        leaders = sorted({fact[2] for fact in facts})
        node_of_rank = [leaders.index(fact[2]) for fact in facts]
        node_index = node_of_rank[rank]
        local_ranks = [r for r in range(size) if node_of_rank[r] == node_index]
        # Some MPIs (Open MPI) set up a new communicator's shared-memory collectives on its
        # first use, which can take tens of milliseconds: pay that here, at group setup,
        # not inside the first window's descriptor exchange.
        local_comm.Barrier()
        return cls(
            comm=comm, local_comm=local_comm, rank=rank, size=size,
            local_rank=local_comm.Get_rank(), local_size=local_comm.Get_size(),
            node_index=node_index, node_count=len(leaders), hostname=hostname,
            hostnames=[fact[0] for fact in facts], pids=[fact[1] for fact in facts],
            node_of_rank=node_of_rank, local_ranks=local_ranks)

    def where(self, rank: int | None = None) -> str:
        """``'rank 1@node3'`` for ``rank`` (default: this rank)."""
        rank = self.rank if rank is None else rank
        return f"rank {rank}@{self.hostnames[rank]}"

    def is_local(self, rank: int) -> bool:
        """Whether ``rank`` runs on this node (its memory can be mapped here)."""
        return self.node_of_rank[rank] == self.node_index

    def local_index(self, rank: int) -> int:
        """Local rank of world rank ``rank``, which must be on this node."""
        return self.local_ranks.index(rank)

    def close(self) -> None:
        """Free the node-local communicator (idempotent)."""
        if self._owns_local_comm and self.local_comm is not None:
            try:
                self.local_comm.Free()
            except Exception:
                pass
            self.local_comm = None
