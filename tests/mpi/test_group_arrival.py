"""A group made on some ranks only, or by a rank much later than the others: every rank
that makes it raises within IPCSHARE_ARRIVAL_TIMEOUT, none goes on into MPI's splits (where
it would wait for ever), and a rank waiting past the group's timeout says why it waits.
Host backend; each test works on a duplicate of the world, so the waits a rank gave up on
are matched by the late ranks and no later test meets them."""

from __future__ import annotations

import _thread
import logging
import threading
import time

import numpy as np
import pytest

import ipcshare
from ipcshare.runtime.errors import ExchangeTimeout

pytestmark = pytest.mark.mpi


@pytest.fixture
def own_comm(comm):
    sub = comm.Dup()
    yield sub
    sub.Free()


def _needs_two(comm) -> None:
    if comm.size < 2:
        pytest.skip("needs 2 ranks")


@pytest.mark.world_sizes(2, 3)
def test_a_group_made_by_rank_0_alone_fails_there_and_a_late_maker_is_told(own_comm, monkeypatch):
    _needs_two(own_comm)
    monkeypatch.setenv("IPCSHARE_ARRIVAL_TIMEOUT", "1.5")
    own_comm.Barrier()
    start = time.monotonic()
    if own_comm.rank == 0:
        with pytest.raises(ExchangeTimeout) as info:
            ipcshare.Group(backend="host", comm=own_comm)
        waited = time.monotonic() - start
        assert 1.5 <= waited < 10, waited
        message = str(info.value)
        assert f"over {own_comm.size} ranks: not every rank arrived within 1.5 s" in message
        assert "IPCSHARE_ARRIVAL_TIMEOUT" in message
    else:
        # The others come after rank 0 gave up: their barrier completes at once (rank 0's
        # is posted), and only the second round tells them not to go on into the split.
        time.sleep(3.0)
        with pytest.raises(ExchangeTimeout) as info:
            ipcshare.Group(backend="host", comm=own_comm)
        assert ("every rank arrived, but a rank had given up waiting before the last one "
                "came (after 1.5 s") in str(info.value)
        assert time.monotonic() - start < 12
    # Every rank left the attempt together: the communicator is usable and in step.
    assert own_comm.allgather(own_comm.rank) == list(range(own_comm.size))


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.world_sizes(2, 3)
def test_a_rank_waiting_past_the_group_timeout_warns_then_the_group_is_made(own_comm):
    _needs_two(own_comm)
    # The package's own handler writes to the stderr of the test that made it: read the
    # records instead.
    lines = _Lines()
    logging.getLogger("ipcshare").addHandler(lines)
    own_comm.Barrier()
    if own_comm.rank == own_comm.size - 1:
        time.sleep(1.5)   # late, but well within the arrival timeout (600 s)
    with ipcshare.Group(backend="host", comm=own_comm, timeout=0.5) as g:
        window = g.window(64)
        np.asarray(window.local)[:8] = g.rank + 1
        window.barrier()
        for peer in range(g.size):
            assert np.asarray(window.peer(peer))[:8].tolist() == [peer + 1] * 8
        window.barrier()
    logging.getLogger("ipcshare").removeHandler(lines)
    warned = [line for line in lines.lines if "for the others to arrive" in line]
    if own_comm.rank == 0:
        assert len(warned) == 1, lines.lines
        assert "rank 0 has waited" in warned[0] and "Giving up after 600 s" in warned[0]
    if own_comm.rank == own_comm.size - 1:
        assert warned == [], warned


@pytest.mark.world_sizes(2, 3)
def test_ctrl_c_while_waiting_to_arrive_stops_the_others_going_on(own_comm):
    # Rank 0 is interrupted while it waits for the others: it posts its "gave up" verdict
    # before the KeyboardInterrupt leaves, so the others, arriving later, do not go on
    # into the splits without it (where they would wait for ever).
    _needs_two(own_comm)
    own_comm.Barrier()
    if own_comm.rank == 0:
        timer = threading.Timer(0.5, _thread.interrupt_main)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            ipcshare.Group(backend="host", comm=own_comm)
        timer.join()
    else:
        time.sleep(1.5)
        with pytest.raises(ExchangeTimeout, match="every rank arrived, but a rank had given up"):
            ipcshare.Group(backend="host", comm=own_comm)
    assert own_comm.allgather(own_comm.rank) == list(range(own_comm.size))
