"""What every call across nodes starts with: one word per rank, agreed over the whole
group before any step moves an element.

A call that one rank's own checks refuse is still one call for every rank
(call_marks.py). On one node the call's first meeting carries the refusing rank's mark.
Across nodes there is no such meeting: each call is steps inside the nodes and steps on
the rails; a rail step's MPI collective needs every rail rank's count, which a refusing
rank does not know; the all-gather's first step is a rail step, and the all-reduce's
first step writes the user's output on every node that did not refuse; NCCL queues the
rail step on the stream before any node step has run. So the ranks agree first: each
rank gives its call's signature digest, or ``REFUSED`` where its checks refused the
call, and one MPI all-reduce of two words (the lowest word, and the lowest negated: the
highest) tells every rank whether every rank gave the same digest. Only then does a
step start. Where they did not (an error path), every rank sends what it
calls or why it refused, and every rank raises the same one-line error in that call; no
element moved anywhere, and the ranks stay in step.

Cost on the good path: one persistent all-reduce of 16 bytes over the group per call,
waited for as the rail steps wait (docs/RELIABILITY.md, R10, gives the figures measured).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...liveness.deadline_waits import wait_request
from ...runtime.errors import CollectiveError
from ...topology.world import mpi
from ..agreement import disagreement_error
from ..call_marks import refusal_error

__all__ = ["CallAgreement", "REFUSED", "Refusal", "refusals_error"]

# The word of a rank whose checks refused the call: below every digest (a signature's
# digest has bit 63 clear, so it is never negative as an int64).
REFUSED = -1


class Refusal:
    """Why this rank refused a call: the collective, what was refused (``argument``:
    ``output_splits``, ``algo``, ...; the error says ``rank r's <argument> failed its
    check there``), and what the check said."""

    __slots__ = ("call", "argument", "detail")

    def __init__(self, call: str, argument: str, detail: str) -> None:
        self.call, self.argument, self.detail = call, argument, detail

    def note(self) -> tuple[str, str, str, str]:
        return ("refused", self.call, self.argument, self.detail)


class CallAgreement:
    """The per-call agreement of a communicator spanning nodes, over the group's
    communicator (collective: every rank of the group calls ``agree`` or ``refuse`` once
    per call, in the same order)."""

    def __init__(self, group: Any) -> None:
        self._group = group
        MPI, comm = mpi(), group.world.comm
        # [word, -word] in, [lowest word, -highest word] out.
        self._mine = np.zeros(2, np.int64)
        self._agreed = np.zeros(2, np.int64)
        mine, agreed = self._mine, self._agreed
        try:
            # A persistent all-reduce (MPI 4), started each call: it took 2.9-4.2 us at 2
            # ranks where a new non-blocking one took 3.9-7.8 (MPICH 4, one machine).
            persistent = comm.Allreduce_init(mine, agreed, op=MPI.MIN)
        except (NotImplementedError, AttributeError, MPI.Exception):
            persistent = None

        def start() -> Any:
            if persistent is None:
                return comm.Iallreduce(mine, agreed, op=MPI.MIN)
            persistent.Start()
            return persistent
        self._start = start
        self._persistent = persistent

    def agree(self, digest: int, describe: Callable[[], str]) -> None:
        """Meet every rank with this call's signature ``digest``; return when every rank
        gave the same one.

        Raises:
            CollectiveError: some rank refused its call (naming each such rank, its
                argument and what its check said), or the ranks' calls differ (naming
                what each rank calls); on every rank, in this call.
            ExchangeTimeout / PeerDied: a rank did not come (the communicator then takes
                no more calls).
        """
        if self._meet(digest):
            return
        raise self._error(("calls", describe()))

    def refuse(self, refusal: Refusal) -> None:
        """Meet every rank with this rank's refusal of the call, then raise the error
        every rank raises.

        Raises:
            CollectiveError: naming every refusing rank, its argument and what its check
                said; on every rank, in this call.
            ExchangeTimeout / PeerDied: as ``agree``.
        """
        self._meet(REFUSED)
        raise self._error(refusal.note())

    def _meet(self, word: int) -> bool:
        """Whether every rank gave ``word``, a digest (one all-reduce of two words)."""
        group = self._group
        group.rendezvous.check_usable("a call across nodes")
        self._mine[0], self._mine[1] = word, -word
        wait_request(self._start(), watch=group.watch, timeout=group.signal_timeout,
                     what="the call's agreement between nodes")
        lowest, highest = int(self._agreed[0]), -int(self._agreed[1])
        return lowest == highest and lowest >= 0

    def close(self) -> None:
        """Free the persistent request (idempotent; local). One a wait gave up on is
        MPI's until it completes (runtime/abandoned_requests.py holds it): left as it is."""
        persistent, self._persistent = self._persistent, None
        if persistent is not None and persistent.Test():
            persistent.Free()

    def _error(self, note: tuple) -> CollectiveError:
        """The error of a call whose ranks did not all give one digest, from every
        rank's ``note`` (an error path only: one more meeting)."""
        notes = self._group.collective("collective call", note)
        if any(kind == "refused" for kind, *_ in notes):
            return refusals_error(notes)
        return disagreement_error([text for _kind, text in notes])


def refusals_error(notes: list[tuple]) -> CollectiveError:
    """The one-line error of a call that ranks refused, from every rank's note (by rank:
    ``("refused", call, argument, detail)`` or ``("calls", description)``), e.g.
    ``all_reduce: rank 2's op failed its check there (op='prod' is not a reduction ...);
    found by every rank in the same call, no element moved``. Every rank refusing alike
    is said once (``every rank's collective failed its check there (...)``)."""
    refusals = [(rank, tuple(note[1:])) for rank, note in enumerate(notes)
                if note[0] == "refused"]
    call = refusals[0][1][0]
    if len(notes) > 1 and len({refusal for _, refusal in refusals} |
                              {note for note in notes if note[0] != "refused"}) == 1:
        refusals = [("every rank", refusals[0][1])]
    return refusal_error(call, [(who if isinstance(who, str) else f"rank {who}", argument,
                                 detail) for who, (_call, argument, detail) in refusals])
