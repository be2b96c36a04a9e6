"""MPI requests that a wait gave up on (a deadline passed, Ctrl-C). MPI still owns them:
when the late rank comes after all they complete, and MPI reads or writes their buffers
then. So they and their buffers are held here, never freed under MPI, until they have
completed; completed ones are dropped whenever another is kept.

A request that never completes must not meet MPI_Finalize either: mpi4py finalizes after
Python has freed every object, so MPI would write into freed memory (seen: "malloc():
unsorted double linked list corrupted" in MPI_Finalize after a 1 ms exchange timeout), or
wait in it for a rank that never posts its part. A process holding one at exit waits a
moment for it (``settle``), then leaves without MPI_Finalize (``leave_if_unsettled``).
``abandoned`` tells whether this process ever gave up on a request: its job then failed,
and peers may have left without MPI_Finalize (the CLI leaves without it then too)."""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any

__all__ = ["keep", "abandoned", "settle", "leave_if_unsettled", "SETTLE_S"]

_HELD: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
# How long a leaving process waits for its abandoned requests: a late peer that was still
# coming posts its part within this, and the request then completes.
SETTLE_S = 1.0
_LEFT_UNSETTLED_STATUS = 1
_registered = False
_ever = False


def keep(*requests: Any, buffers: tuple[Any, ...] = ()) -> None:
    """Hold ``requests`` (and ``buffers``, where the requests may not hold them) until
    every one of them has completed."""
    global _registered, _ever
    _ever = True
    _HELD[:] = [(kept, held) for kept, held in _HELD
                if not all(_completed(request) for request in kept)]
    _HELD.append((requests, buffers))
    if not _registered:
        # Python's exit handlers run before mpi4py's MPI_Finalize (and before the objects
        # held here are freed): the last moment to keep a request away from it.
        atexit.register(leave_if_unsettled, _LEFT_UNSETTLED_STATUS)
        _registered = True


def abandoned() -> bool:
    """Whether this process ever gave up on an MPI request (completed since or not)."""
    return _ever


def settle(timeout: float = SETTLE_S) -> int:
    """Wait up to ``timeout`` seconds for every held request to complete; returns how
    many have not."""
    deadline = time.monotonic() + timeout
    while True:
        _HELD[:] = [(kept, held) for kept, held in _HELD
                    if not all(_completed(request) for request in kept)]
        if not _HELD or time.monotonic() > deadline:
            return sum(len(kept) for kept, _held in _HELD)
        time.sleep(0.001)


def leave_if_unsettled(status: int, *, before_leaving: Any = None) -> None:
    """Return when no held request is left after ``settle``; otherwise end the process
    now with ``status``, without MPI_Finalize (``before_leaving``, if given, runs first:
    the caller's cleanup of MPI's shared memory)."""
    if not _HELD or not settle():
        return
    if before_leaving is not None:
        before_leaving()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _completed(request: Any) -> bool:
    try:
        return bool(request.Test())
    except Exception:   # MPI reports an error for it (a dead peer's): keep holding it
        return False
