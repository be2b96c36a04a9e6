"""MPI waits with a deadline that ask the peer watch while they wait, and the one watched
collective (an all-gather of picklable values) that every fail-together step meets by.

A plain MPI collective waits forever for a rank that was SIGKILLed (unless the launcher
kills the whole job for us, which hydra does only by default): these waits give up with
PeerDied when the watch saw a node peer exit, and with ExchangeTimeout at the deadline.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

from ..runtime import settings
from ..runtime.abandoned_requests import keep
from ..runtime.errors import ExchangeTimeout, PeerDied, SettingError
from ..topology.arrival import arrival_timeout
from .exit_policy import leave_without_finalize_at_exit
from .pidfd_watch import PeerWatch

__all__ = ["wait_request", "first_meeting_patience", "give_up_on_group", "watched_allgather",
           "watched_barrier", "DeadlineComm"]

# Waits on MPI requests poll MPI_Test and yield the core in between (small collectives
# finish within microseconds and must not pay for a sleep); every _POLLS_PER_CHECK polls
# they ask the watch and the clock, and after _POLLS_BEFORE_SLEEP polls they also sleep.
_POLLS_PER_CHECK = 64
_POLLS_BEFORE_SLEEP = 50_000
_LONG_WAIT_SLEEP_S = 50e-6
# How often a wait past its timeout looks whether a peer is stopped (extra_while_running).
_STOPPED_LOOK_S = 0.05
# watched_allgather's fixed slot per rank, and the length word at its start.
_SLOT_BYTES = 512
_LENGTH = struct.Struct("=i")


def wait_request(request: Any, *, watch: PeerWatch | None, timeout: float, what: str,
                 extra_while_running: float = 0.0) -> None:
    """Complete a non-blocking MPI request, giving up when a peer dies or time runs out.

    ``extra_while_running``: seconds the wait goes on past ``timeout`` as long as no
    watched peer is stopped, for a wait on a rank known to be busy for a while (one rank
    measuring the machine while the others wait): a stopped peer ends it at ``timeout``
    as any other wait, a slow but running one gets the extra time.

    Raises:
        PeerDied: a watched rank exited; the request is abandoned (``watch.failed``).
        ExchangeTimeout: not complete within ``timeout`` seconds (a rank on another node
            died or hangs, or a watched one is stopped), or ``timeout`` plus
            ``extra_while_running``; the request is abandoned.
    """
    if request.Test():
        return
    deadline = time.monotonic() + timeout
    last_chance = deadline + extra_while_running
    polls = 0
    try:
        while not request.Test():
            polls += 1
            if polls % _POLLS_PER_CHECK:
                # Ranks may outnumber cores: let the one we wait for run. It pays even
                # where they do not: on one H100 node (16 cores, Open MPI) a watched
                # barrier of 2 ranks took 1.8 us with the yield and 8.4 without it, of 5
                # ranks 5.6 and 13.9 (2026-11-24).
                os.sched_yield()
                continue
            if watch is not None:
                watch.check(what)
            now = time.monotonic()
            if now > deadline:
                stopped = watch.stopped_ranks() if watch is not None else []
                if not stopped and now < last_chance:
                    # Nobody is stopped: the busy rank is still at work. Look again in a
                    # while, not at every poll (each look reads /proc).
                    deadline = min(now + _STOPPED_LOOK_S, last_chance)
                    continue
                if stopped:
                    raise ExchangeTimeout(f"{what}: {watch.describe_stopped(stopped)}; "
                                          f"not every rank arrived within {timeout:g} s")
                raise ExchangeTimeout(
                    f"{what}: not every rank arrived within "
                    f"{timeout + extra_while_running:g} s (a rank died or hangs; see its own "
                    "output)")
            if polls > _POLLS_BEFORE_SLEEP:
                time.sleep(_LONG_WAIT_SLEEP_S)  # a long wait: stop burning a shared core
    except BaseException as exc:   # Ctrl-C abandons the request too
        keep(request)   # MPI still owns it (runtime/abandoned_requests.py)
        if not isinstance(exc, Exception):
            raise
        if watch is not None:
            give_up_on_group(watch, str(exc))
            # MPICH may report the loss of a peer as an MPI error: name the peer instead.
            if not isinstance(exc, PeerDied) and watch.dead_ranks:
                raise PeerDied(watch.describe(what)) from exc
        raise


def first_meeting_patience(timeout: float | None = None) -> dict[str, float]:
    """``timeout`` and ``extra_while_running`` for a wait among ranks that just arrived
    (the first agreements of a command or a group, before its windows): a stopped or
    dead rank is given up on after ``timeout`` (default: the exchange timeout, or its
    default where the setting is malformed: it is refused by name later, on every rank
    together), a running one is waited for as long as ranks may take to arrive
    (``IPCSHARE_ARRIVAL_TIMEOUT``)."""
    if timeout is None or settings.duration_problem(timeout) is not None:
        try:
            timeout = settings.exchange_timeout()
        except SettingError:
            timeout = settings.DEFAULT_EXCHANGE_TIMEOUT_S
    return {"timeout": timeout, "extra_while_running": max(0.0, arrival_timeout() - timeout)}


def give_up_on_group(watch: PeerWatch, reason: str) -> None:
    """This rank gave up on a wait for ``reason``: mark the group failed (its
    communicators may hold requests that never complete), and where a peer is dead or
    stopped, have this process leave without MPI_Finalize, which that peer could not
    answer (``exit_policy``)."""
    watch.fail(reason)
    stopped = watch.stopped_ranks()
    if watch.dead_ranks or stopped:
        leave_without_finalize_at_exit(reason,
                                       stopped_pids=[watch.world.pids[r] for r in stopped])


def watched_allgather(comm: Any, value: Any, *, watch: PeerWatch | None, timeout: float,
                      what: str, extra_while_running: float = 0.0) -> list[Any]:
    """Collective: every rank's picklable ``value``, by rank, like ``comm.allgather``, but
    with a deadline and the watch consulted while waiting.

    Values that pickle to at most ``_SLOT_BYTES - 4`` bytes (statuses, sizes, handles)
    travel in one fixed-size all-gather; larger ones take a second, sized round.

    ``extra_while_running``: as ``wait_request``.

    Raises:
        PeerDied / ExchangeTimeout: as ``wait_request``.
    """
    import pickle

    from ..topology.world import mpi

    MPI = mpi()
    size = comm.Get_size()
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    slot = bytearray(_SLOT_BYTES)
    _LENGTH.pack_into(slot, 0, len(data))
    if len(data) <= _SLOT_BYTES - _LENGTH.size:
        slot[_LENGTH.size:_LENGTH.size + len(data)] = data
    gathered = bytearray(size * _SLOT_BYTES)
    wait_request(comm.Iallgather([slot, MPI.BYTE], [gathered, MPI.BYTE]), watch=watch,
                 timeout=timeout, what=what, extra_while_running=extra_while_running)
    lengths = [_LENGTH.unpack_from(gathered, r * _SLOT_BYTES)[0] for r in range(size)]
    if max(lengths) <= _SLOT_BYTES - _LENGTH.size:
        return [pickle.loads(gathered[r * _SLOT_BYTES + _LENGTH.size:
                                      r * _SLOT_BYTES + _LENGTH.size + lengths[r]])
                for r in range(size)]
    offsets = [sum(lengths[:r]) for r in range(size)]
    everything = bytearray(sum(lengths))
    wait_request(comm.Iallgatherv([data, MPI.BYTE], [everything, (lengths, offsets), MPI.BYTE]),
                 watch=watch, timeout=timeout, what=what,
                 extra_while_running=extra_while_running)
    return [pickle.loads(everything[o:o + n]) for o, n in zip(offsets, lengths, strict=True)]


def watched_barrier(comm: Any, *, watch: PeerWatch | None, timeout: float, what: str) -> None:
    """Collective: ``comm.Barrier()`` with a deadline and the watch consulted.

    Raises:
        PeerDied / ExchangeTimeout: as ``wait_request``.
    """
    wait_request(comm.Ibarrier(), watch=watch, timeout=timeout, what=what)


class DeadlineComm:
    """The blocking collectives a command's bookkeeping makes (mpi4py's ``allgather``,
    ``allreduce``, ``gather``, ``bcast``, ``Barrier``, ``Allreduce``), each with a
    deadline and the watch consulted, over ``comm``: a stopped or silent rank ends every
    other rank's wait with ExchangeTimeout (naming it where the watch sees it stopped),
    a dead one with PeerDied, instead of a wait for ever. ``label`` says what the waits
    are for in those messages (the caller updates it as it goes).

    Only those calls: anything else of the communicator is not reachable through it, so
    no blocking call slips in unnoticed.
    """

    def __init__(self, comm: Any, *, watch: PeerWatch | None, timeout: float,
                 label: str) -> None:
        self.comm = comm
        self.watch = watch
        self.timeout = timeout
        self.label = label

    def Get_size(self) -> int:
        return self.comm.Get_size()

    def Get_rank(self) -> int:
        return self.comm.Get_rank()

    def allgather(self, value: Any) -> list[Any]:
        return watched_allgather(self.comm, value, watch=self.watch, timeout=self.timeout,
                                 what=self.label)

    def allreduce(self, value: Any, op: Any = None) -> Any:
        """Every rank's ``value`` combined by ``op`` (an MPI.Op, default SUM), in rank
        order, on every rank."""
        from ..topology.world import mpi

        combine = op if op is not None else mpi().SUM
        values = self.allgather(value)
        result = values[0]
        for other in values[1:]:
            result = combine(result, other)
        return result

    def gather(self, value: Any, root: int = 0) -> list[Any] | None:
        values = self.allgather(value)
        return values if self.comm.Get_rank() == root else None

    def bcast(self, value: Any, root: int = 0) -> Any:
        return self.allgather(value if self.comm.Get_rank() == root else None)[root]

    def Barrier(self) -> None:
        watched_barrier(self.comm, watch=self.watch, timeout=self.timeout, what=self.label)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:
        from ..topology.world import mpi

        MPI = mpi()
        request = self.comm.Iallreduce(sendbuf, recvbuf, op=op if op is not None else MPI.SUM)
        wait_request(request, watch=self.watch, timeout=self.timeout, what=self.label)
