"""The rules of test_failed_calls.py on a communicator spanning (virtual) nodes: a second
thread in a call is refused by name, a call that failed on this rank ends the calls (bound
ones included), and an error of one rank's own inside the with-blocks reaches its user
after the short grace, the node group's closing barrier included. Host backend, MPI
between nodes; 2 virtual nodes (2 x 1 at -n 2, 2 x 2 at -n 4)."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import ipcshare
from ipcshare.collectives.across_nodes.communicator import NodesCommunicator
from ipcshare.runtime.errors import CollectiveError, SignalTimeout, WindowError
from ipcshare.topology.world import VIRTUAL_NODES_ENV

from .test_failed_calls import second_thread_is_refused

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def two_nodes(comm, monkeypatch):
    if comm.size not in (2, 4):
        pytest.skip(f"2 even virtual nodes of consecutive ranks need 2 or 4 ranks here, not "
                    f"{comm.size}")
    monkeypatch.setenv(VIRTUAL_NODES_ENV, "2")
    yield
    gc.collect()   # what caught tracebacks held (views of window memory)


def test_a_second_thread_in_a_call_across_nodes_is_refused(comm):
    with ipcshare.Group(backend="host") as g:
        c = g.communicator(max_bytes=4096, inter="mpi")
        assert isinstance(c, NodesCommunicator)
        second_thread_is_refused(c, comm)
        c.close()


def test_a_call_across_nodes_that_timed_out_ends_the_calls(comm):
    if comm.size != 4:
        pytest.skip("a step inside a node needs 2 ranks per node (2 x 2 at -n 4)")
    g = ipcshare.Group(backend="host", timeout=1.0)
    c = g.communicator(max_bytes=4096, inter="mpi")
    x = np.full(4, comm.rank + 1, np.float32)
    c.all_reduce(x)   # agreed and bound: the next calls only wait for peers
    if comm.rank == 1:
        time.sleep(2.5)   # late: its node peer gives up on the call
    try:
        c.all_reduce(x)
        first = "returned"
    except SignalTimeout:   # in a step inside the node
        first = "timeout"
    except ipcshare.ExchangeTimeout as exc:   # in the call's agreement or a rail step
        assert "between nodes: not every rank arrived within 1 s" in str(exc)
        first = "timeout"
    # The other ranks gave up on rank 1 in the agreement that starts the call; rank 1,
    # late, completes that agreement with their abandoned parts and then waits for its
    # node peer in the first step: every rank's call failed.
    assert first == "timeout"
    with pytest.raises(CollectiveError, match="takes no more calls"):
        c.all_reduce(np.full(4, comm.rank + 1, np.float32))
    with pytest.raises(CollectiveError, match="takes no more calls"):
        c.synchronize()
    # The user's communicator is in step: the group's own traffic, given up on, went on
    # the group's duplicate of it.
    comm.Barrier()   # every rank is done failing: the closes meet
    g.close()
    # A later group in the same processes works. Before, the first group's rail
    # communicator was freed, MPI gave its context to the later group's node communicator,
    # and the other node's message that rank 0 never took was read there as a node peer's.
    with ipcshare.Group(backend="host", timeout=5.0) as later:
        with later.communicator(max_bytes=4096, inter="mpi") as c:
            y = np.full(4, comm.rank + 1, np.float32)
            c.all_reduce(y)
            assert y.tolist() == [sum(range(1, comm.size + 1))] * 4


@pytest.mark.world_sizes(4)
def test_an_error_of_one_rank_inside_the_with_blocks_reaches_its_user(comm):
    # Rank 1 fails on its own input while the others are in a call. Its closes (the
    # communicator's node group included) wait a short grace, not the whole timeout.
    from ipcshare.liveness.consensus import LEAVE_GRACE_S

    timeout = 6.0
    if comm.rank == 1:
        started = time.monotonic()
        with pytest.raises(ValueError, match="bad input file on rank 1"):
            with ipcshare.Group(backend="host", timeout=timeout) as g:
                with g.communicator(max_bytes=4096, inter="mpi"):
                    left = time.monotonic()
                    raise ValueError("bad input file on rank 1")
        assert time.monotonic() - left < 2 * LEAVE_GRACE_S + 1.5 < timeout
        assert time.monotonic() - started < timeout + 5
    else:
        # Rank 1's closes cross their first call's agreement: a timeout or the crossing.
        with pytest.raises((SignalTimeout, ipcshare.ExchangeTimeout, WindowError)):
            with ipcshare.Group(backend="host", timeout=timeout) as g:
                with g.communicator(max_bytes=4096, inter="mpi") as c:
                    c.all_reduce(np.ones(4, np.float32))
    comm.Barrier()   # the next test starts with every rank


@pytest.mark.world_sizes(4)
def test_an_error_of_one_rank_inside_the_group_only_reaches_its_user(comm):
    # As above, with the communicator left open (no with-block of its own): the group's
    # close closes it, and the grace reaches the node group's closing barrier too.
    from ipcshare.liveness.consensus import LEAVE_GRACE_S

    timeout = 6.0
    if comm.rank == 1:
        with pytest.raises(ValueError, match="bad input file on rank 1"):
            with ipcshare.Group(backend="host", timeout=timeout) as g:
                g.communicator(max_bytes=4096, inter="mpi")
                left = time.monotonic()
                raise ValueError("bad input file on rank 1")
        assert time.monotonic() - left < 2 * LEAVE_GRACE_S + 1.5 < timeout
    else:
        with pytest.raises((SignalTimeout, ipcshare.ExchangeTimeout, WindowError)):
            with ipcshare.Group(backend="host", timeout=timeout) as g:
                g.communicator(max_bytes=4096, inter="mpi").all_reduce(
                    np.ones(4, np.float32))
    comm.Barrier()
