"""What each rank sees when rank 0 skips a communicator call that the others make: the
GPU tests of every algorithm family feed their kernels this silent peer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ipcshare.runtime.errors import SignalTimeout


def assert_rank_zero_is_named_when_silent(comm: Any, rank: int, cm: Any,
                                          make_call: Callable[[], None]) -> None:
    """Every rank makes the call once (agreed and bound everywhere), then every rank but
    0 makes it again: their ``synchronize()`` must raise a SignalTimeout naming rank 0,
    rank 0 must see nothing, and no rank may be left waiting."""
    make_call()
    cm.synchronize()
    comm.Barrier()
    outcome = "ok"
    if rank != 0:  # rank 0 stays silent: the others must give up on it
        make_call()
        try:
            cm.synchronize()
        except SignalTimeout as exc:
            outcome = str(exc)
    comm.Barrier()
    if rank == 0:
        assert outcome == "ok"
    else:
        assert "gave up waiting for rank 0@" in outcome, outcome
