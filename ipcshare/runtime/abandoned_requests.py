"""MPI requests that a wait gave up on (a deadline passed, Ctrl-C). MPI still owns them:
when the late rank comes after all they complete, and MPI reads or writes their buffers
then. So they and their buffers are held here, never freed under MPI, until they have
completed; completed ones are dropped whenever another is kept."""

from __future__ import annotations

from typing import Any

__all__ = ["keep"]

_HELD: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []


def keep(*requests: Any, buffers: tuple[Any, ...] = ()) -> None:
    """Hold ``requests`` (and ``buffers``, where the requests may not hold them) until
    every one of them has completed."""
    _HELD[:] = [(kept, held) for kept, held in _HELD
                if not all(_completed(request) for request in kept)]
    _HELD.append((requests, buffers))


def _completed(request: Any) -> bool:
    try:
        return bool(request.Test())
    except Exception:   # MPI reports an error for it (a dead peer's): keep holding it
        return False
