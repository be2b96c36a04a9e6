"""MPI requests that a wait gave up on (a deadline passed, Ctrl-C). MPI still owns them:
when the late rank comes after all they complete, and MPI reads or writes their buffers
then. So they and their buffers are held here, never freed under MPI, until they have
completed; completed ones are dropped whenever another is kept.

That includes the process's exit: mpi4py calls MPI_Finalize after Python has freed every
object, and MPI then completed such a request into freed memory (seen: "malloc():
unsorted double linked list corrupted" in MPI_Finalize after a 1 ms exchange timeout).
So what is still held at exit is kept alive past it. ``abandoned`` tells whether this
process ever gave up on a request: its job failed, and peers may have left without
MPI_Finalize (the CLI then leaves without it too: cli/main.py)."""

from __future__ import annotations

import atexit
import ctypes
from typing import Any

__all__ = ["keep", "abandoned"]

_HELD: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
_ever = False


def keep(*requests: Any, buffers: tuple[Any, ...] = ()) -> None:
    """Hold ``requests`` (and ``buffers``, where the requests may not hold them) until
    every one of them has completed."""
    global _ever
    if not _ever:
        # Python's exit handlers run before objects are freed and before mpi4py's
        # MPI_Finalize: the last moment to keep what MPI may still write into.
        atexit.register(_keep_past_exit)
    _ever = True
    _HELD[:] = [(kept, held) for kept, held in _HELD
                if not all(_completed(request) for request in kept)]
    _HELD.append((requests, buffers))


def abandoned() -> bool:
    """Whether this process ever gave up on an MPI request (completed since or not)."""
    return _ever


def _keep_past_exit() -> None:
    """Give every request still held, and its buffers, a reference that is never dropped:
    freed at the interpreter's teardown, they would be written into by MPI_Finalize."""
    for entry in _HELD:
        if not all(_completed(request) for request in entry[0]):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(entry))


def _completed(request: Any) -> bool:
    try:
        return bool(request.Test())
    except Exception:   # MPI reports an error for it (a dead peer's): keep holding it
        return False
