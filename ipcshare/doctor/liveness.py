"""Ranks watch each other: meeting points with a deadline, and a watchdog for stuck stages.

A plain MPI barrier waits forever for a rank that died or hangs. The doctor's meeting
points are point-to-point messages polled against a deadline instead, so the ranks that
came can say which rank did not ("rank 1@node3 did not answer within 60 s at stage
'matrix host-shm'") and leave. A rank stuck inside a library collective (a window being
built when its peer hangs) cannot poll, so a watchdog thread ends it after the stage's
budget.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..runtime import settings
from ..runtime.errors import IpcShareError

__all__ = ["PeerLost", "Checkpoints", "Watchdog", "maybe_die_for_test", "DIE_RANK_VARIABLE",
           "DIE_STAGE_VARIABLE"]

# Test hook: the rank named here leaves with os._exit when it reaches the stage named in
# DIE_STAGE_VARIABLE (default "matrix"), as a crashed rank would. Used only by tests.
DIE_RANK_VARIABLE = settings.DOCTOR_TEST_DIE_RANK
DIE_STAGE_VARIABLE = settings.DOCTOR_TEST_DIE_STAGE
DIE_EXIT_STATUS = 17

_FIRST_POLL_S = 20e-6
_MAX_POLL_S = 5e-3


class PeerLost(IpcShareError):
    """A rank did not reach a doctor checkpoint in time: it died or hangs."""


def _tags(sequence: int) -> tuple[int, int]:
    # Up to the root, then down from it; MPI guarantees tags up to 32767 at least.
    base = 2 * (sequence % 16000)
    return base + 1, base + 2


def _probe(comm: Any, source: int, tag: int) -> Any:
    """A matched probe that treats an MPI error (a peer known dead) as 'no message'."""
    try:
        return comm.improbe(source=source, tag=tag)
    except Exception:  # mpi4py raises MPI.Exception; the deadline then speaks
        return None


class Checkpoints:
    """Deadline-bounded meeting points over one communicator (rank 0 of it is the hub).

    Uses its own duplicate of ``comm``, so its messages never meet the traffic of the
    windows under test. ``name_rank(r)`` spells rank ``r`` of ``comm`` for messages.
    """

    def __init__(self, comm: Any, *, timeout: float, name_rank: Callable[[int], str]) -> None:
        self._comm = comm.Dup()
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self.timeout = timeout
        self._name_rank = name_rank
        self._sequence = 0
        self._pending_send: Any = None

    def gather(self, stage: str, value: Any, *, timeout: float | None = None) -> list[Any] | None:
        """Send ``value`` to rank 0; rank 0 returns every rank's value, others None.

        Rank 0 waits at most ``timeout`` (default: the checkpoints' timeout) for the
        others; what it decides is delivered by the ``release`` that must follow.

        Raises:
            PeerLost: on rank 0, naming the ranks that did not answer (it tells the
                ranks that did, in ``release``).
        """
        self._sequence += 1
        up, _down = _tags(self._sequence)
        limit = self.timeout if timeout is None else timeout
        if self.rank != 0:
            self._pending_send = self._comm.isend(value, dest=0, tag=up)
            return None
        values: list[Any] = [None] * self.size
        values[0] = value
        missing = set(range(1, self.size))
        deadline = time.monotonic() + limit
        pause = _FIRST_POLL_S
        while missing:
            for source in sorted(missing):
                message = _probe(self._comm, source, up)
                if message is not None:
                    values[source] = message.recv()
                    missing.discard(source)
            if not missing:
                break
            if time.monotonic() > deadline:
                lost = ", ".join(self._name_rank(r) for r in sorted(missing))
                text = (f"{lost} did not answer within {limit:g} s at stage '{stage}': "
                        "died or hangs (see its own output)")
                self._answer_all(("lost", text), skip=missing)
                raise PeerLost(text)
            time.sleep(pause)
            pause = min(pause * 2, _MAX_POLL_S)
        return values

    def release(self, stage: str, value: Any, *, timeout: float | None = None) -> Any:
        """Rank 0 hands ``value`` to every rank; every rank returns it.

        Raises:
            PeerLost: rank 0 did not answer in time, or it reported another rank lost.
        """
        _up, down = _tags(self._sequence)
        limit = self.timeout if timeout is None else timeout
        if self.rank == 0:
            self._answer_all(("ok", value), skip=set())
            return value
        # Rank 0 may itself wait up to the timeout for the slowest rank before it answers,
        # and may arrive up to the timeout late: allow both, so that it is rank 0 that
        # names a missing rank, not every early rank that names rank 0.
        limit = 2 * limit + 1.0
        deadline = time.monotonic() + limit
        pause = _FIRST_POLL_S
        while True:
            message = _probe(self._comm, 0, down)
            if message is not None:
                kind, payload = message.recv()
                break
            if time.monotonic() > deadline:
                raise PeerLost(f"{self._name_rank(0)} did not answer within {limit:g} s at "
                               f"stage '{stage}': died or hangs (see its own output)")
            time.sleep(pause)
            pause = min(pause * 2, _MAX_POLL_S)
        # Rank 0 has our value (it answered), so the send is complete or about to be.
        if self._pending_send is not None:
            self._pending_send.wait()
            self._pending_send = None
        if kind == "lost":
            raise PeerLost(payload)
        return payload

    def meet(self, stage: str, value: Any = None, *, timeout: float | None = None) -> list[Any]:
        """Collective: every rank's ``value``, on every rank, or PeerLost everywhere that
        can still hear, naming who did not come.

        Raises:
            PeerLost: a rank did not reach this meeting point within the timeout.
        """
        values = self.gather(stage, value, timeout=timeout)
        return self.release(stage, values, timeout=timeout)

    def _answer_all(self, message: tuple[str, Any], *, skip: set[int]) -> None:
        requests = [self._comm.isend(message, dest=r, tag=_tags(self._sequence)[1])
                    for r in range(1, self.size) if r not in skip]
        if message[0] == "ok":
            for request in requests:
                request.wait()
        # A "lost" answer is the last word before this process leaves; its sends to
        # live ranks complete on their own or die with the job.

    def close(self) -> None:
        """Free the duplicate communicator (only after a clean run: a lost peer may
        still owe it messages)."""
        if self._comm is not None:
            self._comm.Free()
            self._comm = None


class Watchdog:
    """Ends this process when one stage runs past its budget.

    ``arm(stage)`` starts the clock for a stage; ``stop()`` ends the watch. On expiry it
    writes one line naming the rank and the stage and calls ``os._exit(status)``:
    nothing else can free a thread blocked inside an MPI collective.
    """

    def __init__(self, *, budget_s: float, who: str, status: int) -> None:
        self.budget_s = budget_s
        self._who = who
        self._status = status
        self._stage = "start"
        self._deadline = time.monotonic() + budget_s
        self._changed = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._watch, name="ipcshare-doctor-watchdog",
                                        daemon=True)
        self._thread.start()

    def arm(self, stage: str) -> None:
        """Start the budget of ``stage`` now."""
        self._stage = stage
        self._deadline = time.monotonic() + self.budget_s
        self._changed.set()

    def stop(self) -> None:
        """Stop watching (idempotent)."""
        self._stopped = True
        self._changed.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stopped:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                sys.stdout.flush()
                sys.stderr.write(
                    f"ipcshare: error: doctor: {self._who} spent more than {self.budget_s:g} s "
                    f"in stage '{self._stage}' (a peer died or hangs inside a collective); "
                    "giving up\n")
                sys.stderr.flush()
                os._exit(self._status)
            self._changed.wait(timeout=remaining)
            self._changed.clear()


def maybe_die_for_test(rank: int, stage: str) -> None:
    """Leave at once, as a crashed rank would, when the test hook names this rank and
    this stage (``IPCSHARE_DOCTOR_TEST_DIE_RANK`` / ``..._STAGE``). Tests only."""
    wanted, wanted_stage = settings.doctor_test_death()
    if not wanted or wanted != str(rank):
        return
    if stage.split()[0] == wanted_stage:
        sys.stdout.flush()
        sys.stderr.write(f"ipcshare: doctor test hook: rank {rank} dies at stage '{stage}'\n")
        sys.stderr.flush()
        os._exit(DIE_EXIT_STATUS)
