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
