"""After a call fails on a rank the ranks are out of step: the communicator takes no more
calls, so no later call can return wrong results (a new user's retry after a timeout
used to pair each rank's call with the peer's previous one). Two threads on one
communicator, and ranks in different group collectives, are refused by name; an error of
one rank inside a with-block reaches its user. Host backend, each test on a group of its
own."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import ipcshare
from ipcshare.runtime.errors import CollectiveError, SignalTimeout, WindowError

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def _collect_what_tracebacks_held():
    # A caught error's traceback holds the frames of the call it ended, and with them
    # views of the window's memory, until the garbage collector breaks the cycle: collect
    # here, so no later test's leak check counts them.
    yield
    gc.collect()


def _needs_two(comm) -> None:
    if comm.size < 2:
        pytest.skip("needs 2 ranks")


def _communicator_and_input(g, comm):
    """A small communicator of ``g`` and this rank's input: rank + 1 everywhere."""
    return g.communicator(max_bytes=4096), np.full(4, comm.rank + 1, np.float32)


@pytest.mark.world_sizes(2, 3)
def test_a_call_that_timed_out_ends_the_calls_and_no_retry_is_wrong(comm):
    _needs_two(comm)
    with ipcshare.Group(backend="host", timeout=1.0) as g:
        c = g.communicator(max_bytes=4096)
        expected = [sum(100 * i + r + 1 for r in range(comm.size)) for i in range(2)]
        outcomes = []
        if comm.rank == 1:
            time.sleep(2.5)  # late for the first call: the others give up on it
        for i in range(2):
            for _attempt in range(2):
                x = np.full(4, 100 * i + comm.rank + 1, np.float32)
                try:
                    c.all_reduce(x)
                except SignalTimeout:
                    outcomes.append((i, "timeout"))
                    continue
                except CollectiveError as exc:
                    assert "takes no more calls" in str(exc) and "SignalTimeout" in str(exc)
                    outcomes.append((i, "refused"))
                    continue
                # whatever completes is right: never a neighbour's call's values
                assert x[0] == expected[i], (i, x[0], outcomes)
                outcomes.append((i, "ok"))
                break
        if comm.rank == 0:
            assert outcomes[0] == (0, "timeout")
            assert all(kind == "refused" for _i, kind in outcomes[1:]), outcomes
        assert "ok" not in [kind for i, kind in outcomes if i == 1], outcomes
        comm.Barrier()   # the group itself still meets: its close, for one
        w = g.window(4096)
        w.close()


def second_thread_is_refused(c, comm) -> None:
    """Rank 0 calls ``c.all_reduce`` on a thread while the others come 1 s later, and a
    second call meanwhile is refused by name; the first call's sum is right, and a bound
    call goes through afterwards."""
    x = np.full(4, comm.rank + 1, np.float32)
    if comm.rank == 0:
        first = threading.Thread(target=c.all_reduce, args=(x,))
        first.start()   # waits in the call for the others, who come in 1 s
        time.sleep(0.3)
        with pytest.raises(CollectiveError, match="in a call on another thread"):
            c.all_reduce(np.zeros(4, np.float32))
        first.join(timeout=30)
        assert not first.is_alive()
    else:
        time.sleep(1.0)
        c.all_reduce(x)
    assert x[0] == sum(range(1, comm.size + 1))   # the first call went through
    c.bind("all_reduce", x)()   # and the communicator still works for one thread
    assert x[0] == comm.size * sum(range(1, comm.size + 1))


@pytest.mark.world_sizes(2, 3)
def test_a_second_thread_in_a_call_is_refused(comm):
    _needs_two(comm)
    with ipcshare.Group(backend="host") as g:
        second_thread_is_refused(g.communicator(max_bytes=4096), comm)


def test_ranks_in_different_group_collectives_are_named(comm):
    _needs_two(comm)
    with ipcshare.Group(backend="host") as g:
        with pytest.raises(WindowError) as caught:
            if comm.rank == 1:
                g.barrier()
            else:
                g.window(4096)
        others = "rank 0" if comm.size == 2 else f"ranks 0, 2{'-3' if comm.size == 4 else ''}"
        assert str(caught.value).startswith("ranks are in different collective steps: ")
        assert "rank 1 in 'group barrier'" in str(caught.value)
        assert f"{others} " in str(caught.value) and "'window rendezvous'" in str(caught.value)
        w = g.window(4096)   # both were refused at the same point: still in step
        w.close()


@pytest.mark.world_sizes(2, 3)
def test_an_error_of_one_rank_in_a_with_block_reaches_its_user(comm):
    # Rank 1 fails on its own input while the others are in a call. Before, its close
    # waited the whole timeout for them and then raised ExchangeTimeout in place of the
    # ValueError; now it waits a short grace and the ValueError comes through.
    from ipcshare.liveness.consensus import LEAVE_GRACE_S

    _needs_two(comm)
    timeout = 6.0
    if comm.rank == 1:
        started = time.monotonic()
        with pytest.raises(ValueError, match="bad input file on rank 1"):
            with ipcshare.Group(backend="host", timeout=timeout) as g:
                g.communicator(max_bytes=4096)
                left = time.monotonic()
                raise ValueError("bad input file on rank 1")
        assert time.monotonic() - left < LEAVE_GRACE_S + 1.5 < timeout
        assert time.monotonic() - started < timeout + 5
    else:
        with pytest.raises(SignalTimeout, match="waiting for rank 1@"):
            with ipcshare.Group(backend="host", timeout=timeout) as g:
                c = g.communicator(max_bytes=4096)
                c.all_reduce(np.ones(4, np.float32))
    comm.Barrier()   # the next test starts with every rank


@pytest.mark.world_sizes(2, 3)
def test_a_call_interrupted_by_ctrl_c_ends_the_calls_too(comm):
    # Ctrl-C leaves this rank's part of the call posted, as a timeout does: a retry got
    # the peer's previous call's sum.
    import signal

    _needs_two(comm)
    with ipcshare.Group(backend="host") as g:
        c, x = _communicator_and_input(g, comm)
        if comm.rank == 0:
            def interrupt(*_):
                raise KeyboardInterrupt

            previous = signal.signal(signal.SIGALRM, interrupt)
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            try:
                with pytest.raises(KeyboardInterrupt):
                    c.all_reduce(x)   # the others come 1.5 s late
            finally:
                signal.signal(signal.SIGALRM, previous)
            with pytest.raises(CollectiveError, match=r"takes no more calls: an earlier call "
                                                      r"failed on this rank \(KeyboardInterrupt"):
                c.all_reduce(x)
        else:
            time.sleep(1.5)
            c.all_reduce(x)   # completes against rank 0's posted part
            assert x[0] == sum(range(1, comm.size + 1))
        comm.Barrier()


def test_a_step_crossed_with_a_collective_is_named(comm):
    # One rank in a fail-together step, another in a plain collective: their payloads
    # differ in shape, and used to be unpacked as each other's (ValueError).
    _needs_two(comm)
    with ipcshare.Group(backend="host") as g:
        c = g.communicator(max_bytes=4096)
        with pytest.raises(WindowError, match="ranks are in different collective steps"):
            if comm.rank == 1:
                c.unregister(np.zeros(4, np.float32))
            else:
                g.barrier()
        comm.Barrier()


def test_a_with_blocks_short_grace_is_for_its_own_close_only(comm):
    with ipcshare.Group(backend="host") as g:
        with pytest.raises(ValueError):
            with g.window(4096):
                raise ValueError("every rank's own")
        assert g.rendezvous.grace is None   # later closes wait the whole timeout again
        g.window(4096).close()
