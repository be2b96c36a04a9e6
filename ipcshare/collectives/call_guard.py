"""What keeps a communicator's calls in step across ranks: one call at a time, and no
call after one failed on this rank.

A call that gave up waiting for a peer (``SignalTimeout``, ``ExchangeTimeout``), saw one
die (``PeerDied``) or was interrupted (Ctrl-C) leaves the ranks out of step: this rank
has posted its part of a call that a late peer may still complete, so a retry would pair
this rank's next call with the peer's previous one, and both would return wrong results
without an error (found by a new user's test on host memory). NCCL answers the same
problem by aborting the communicator; so does this guard: the communicator refuses every
later call. Its group still meets (closing included), since its own collectives are
matched by name (``Rendezvous``) and the peers that gave up on the same call close as
usual.

Two threads calling one communicator at once interleave the same way. NCCL documents its
communicators as usable from one thread at a time; on host memory, where calls run in
Python, the guard enforces it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..runtime.errors import CollectiveError, ExchangeTimeout, PeerDied, SignalTimeout

__all__ = ["CallGuard", "FAILED_CALL_ERRORS"]

# Errors after which this rank's calls are out of step with its peers'.
FAILED_CALL_ERRORS = (SignalTimeout, ExchangeTimeout, PeerDied)


class CallGuard:
    """``failed`` is why the communicator stopped taking calls (None while it takes
    them)."""

    def __init__(self, on_fail: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self.failed: str | None = None
        # Told once, at the first failure: the group then keeps its MPI communicators
        # when it closes (``Group.note_failed_call``).
        self._on_fail = on_fail

    def check(self) -> None:
        """Raise if an earlier call failed on this rank.

        Raises:
            CollectiveError: naming that failure and what to do.
        """
        if self.failed is not None:
            raise CollectiveError(
                f"this communicator takes no more calls: an earlier call failed on this "
                f"rank ({self.failed}), so its ranks are out of step; close it (and its "
                "group), then make new ones on every rank")

    def fail(self, error: BaseException) -> None:
        """Record ``error`` as the end of this communicator's calls (idempotent: the
        first failure is the one named)."""
        if self.failed is None:
            self.failed = f"{type(error).__name__}: {error}"
            if self._on_fail is not None:
                self._on_fail()

    def enter(self) -> None:
        """Before a call run by the host: refuse it after a failure or while another thread
        is in a call. Pair with ``leave``.

        Raises:
            CollectiveError: an earlier failure, or another thread in a call.
        """
        self.check()
        if not self._lock.acquire(blocking=False):
            raise CollectiveError(
                "this communicator is in a call on another thread: call a communicator "
                "from one thread at a time (as NCCL's), or give each thread its own")

    def run(self, call: Callable[[], Any]) -> Any:
        """``call()`` between ``enter`` and ``leave``: for calls that are not on a bound
        call's microsecond budget.

        Raises:
            CollectiveError: as ``enter``; whatever ``call`` raises.
        """
        self.enter()
        try:
            result = call()
        except BaseException as exc:
            self.leave(exc)
            raise
        self.leave(None)
        return result

    def leave(self, error: BaseException | None) -> None:
        """After the call ``enter`` let in, with what it raised (None: it returned). Any
        error but an agreed disagreement leaves this rank's part of the call posted for
        peers that may still complete it, Ctrl-C included: the ranks are out of step."""
        self._lock.release()
        if error is not None and not _agreed(error):
            self.fail(error)


def _agreed(error: BaseException) -> bool:
    """An error every rank raised together (a disagreement found by the headers, checks
    on this rank before anything was posted): the ranks are still in step."""
    return isinstance(error, CollectiveError)
