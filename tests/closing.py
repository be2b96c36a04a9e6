"""How long closing takes, checked on every rank (tests of errors every rank saw: after
one, nothing is left to wait for)."""

from __future__ import annotations

import time
from typing import Any


def assert_closes_within_a_second(comm: Any, *closables: Any) -> None:
    """Close ``closables`` in order (a communicator, then its group) on every rank of the
    MPI communicator ``comm``, after a barrier, and assert that it took under a second on
    every rank."""
    comm.Barrier()
    start = time.monotonic()
    for closable in closables:
        closable.close()
    took = time.monotonic() - start
    every = comm.allgather(took)
    assert max(every) < 1.0, every
