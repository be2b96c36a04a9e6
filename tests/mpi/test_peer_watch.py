"""Watched collectives between real ranks: same results as MPI's, any value size."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.liveness.deadline_waits import watched_allgather, watched_barrier

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("make", [lambda r: r, lambda r: ("status", None, r),
                                  lambda r: "x" * (600 * r + 3),  # some ranks overflow
                                  lambda r: b"\0" * 5000])
def test_watched_allgather_matches_mpi(comm, make):
    with ipcshare.Group(backend="host") as g:
        got = watched_allgather(comm, make(comm.rank), watch=g.watch, timeout=30, what="test")
        assert got == comm.allgather(make(comm.rank))
        watched_barrier(comm, watch=g.watch, timeout=30, what="test")


def test_every_local_peer_is_watched(comm):
    with ipcshare.Group(backend="host") as g:
        others = [r for r in g.world.local_ranks if r != g.rank]
        assert g.watch.watched_ranks == others
        assert g.watch.dead_ranks == [] and g.watch.failed is None


def test_the_deadline_communicator_matches_mpi(comm):
    """What the pattern driver's bookkeeping goes through: the same results as MPI's
    blocking collectives, every one with a deadline."""
    import numpy as np
    from mpi4py import MPI

    with ipcshare.Group(backend="host") as g:
        bounded = g.deadline_comm("test bookkeeping")
        assert bounded.allreduce(comm.rank + 1, op=MPI.MAX) == comm.size
        assert bounded.allreduce(0.5 * comm.rank) == comm.allreduce(0.5 * comm.rank)
        assert bounded.gather(comm.rank * 3, root=0) == comm.gather(comm.rank * 3, root=0)
        assert bounded.bcast("from 0" if comm.rank == 0 else None) == "from 0"
        assert bounded.allgather(comm.rank) == list(range(comm.size))
        values = np.array([comm.rank, 1.0])
        bounded.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
        assert values.tolist() == [comm.size * (comm.size - 1) / 2, comm.size]
        bounded.Barrier()
        assert bounded.Get_size() == comm.size and bounded.Get_rank() == comm.rank
        assert not hasattr(bounded, "Allgather")  # nothing blocking slips through
