"""Every rank of a communicator arrives before a group splits it, or every one is told.

Making a group starts with MPI splits, which block until every rank of the communicator
calls them. A rank that never makes the group (it took a branch the others did not, or it
left) would hold the others there for ever. So the ranks first meet in a non-blocking
barrier polled against a deadline, and then in a second round where each says whether it
was still waiting when the barrier completed. The second round is what makes a late rank
safe: the barrier completes for it as soon as it arrives (the others posted theirs before
giving up), so without the verdict it would go on into a split that nobody else will join.

Ranks reach ``Group()`` at different times for good reasons (imports, loading data on one
rank), so the deadline is long (``IPCSHARE_ARRIVAL_TIMEOUT``, 600 s by default); a rank
still waiting after the group's own timeout logs once what it waits for. A rank that an
earlier world showed to this one (``job_ranks``: same host, same PID namespace) and whose
process is stopped (SIGSTOP, a debugger) is not late: it is given up on after the group's
own timeout, and named.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ..runtime import settings
from ..runtime.abandoned_requests import keep
from ..runtime.errors import ExchangeTimeout, SettingError
from ..runtime.logs import get_logger
from . import job_ranks
from .mpi_import import mpi

__all__ = ["wait_for_every_rank", "DEFAULT_ARRIVAL_TIMEOUT_S"]

log = get_logger("topology")

DEFAULT_ARRIVAL_TIMEOUT_S = 600.0
# Waits poll MPI_Test and yield the core in between (ranks starting together meet within
# microseconds and must not pay for a sleep); every _POLLS_PER_CHECK polls they read the
# clock, and after _POLLS_BEFORE_SLEEP polls they also sleep.
_POLLS_PER_CHECK = 64
_POLLS_BEFORE_SLEEP = 10_000
_SLEEP_S = 0.001
# How often a wait past the exchange timeout looks whether a rank is stopped.
_STOP_LOOK_S = 0.05


def arrival_timeout() -> float:
    """``IPCSHARE_ARRIVAL_TIMEOUT`` in seconds; the default where it is malformed (group
    setup refuses it by name on every rank, after the ranks have met)."""
    try:
        return settings.seconds(settings.ARRIVAL_TIMEOUT, DEFAULT_ARRIVAL_TIMEOUT_S)
    except SettingError:
        return DEFAULT_ARRIVAL_TIMEOUT_S


def _poll(request: Any, deadline: float, warn_at: float | None, on_warn,
          stopped: Callable[[], str | None] | None = None,
          stop_look_at: float | None = None) -> str | None:
    """Test ``request`` until it completes (None) or this rank gives up: ``"deadline"``
    when the deadline passes, or what ``stopped()`` says (a rank is stopped), asked from
    ``stop_look_at`` on, every ``_STOP_LOOK_S``."""
    polls = 0
    while not request.Test():
        polls += 1
        if polls % _POLLS_PER_CHECK:
            os.sched_yield()   # ranks may outnumber cores: let a late one run
            continue
        now = time.monotonic()
        if warn_at is not None and now > warn_at:
            on_warn()
            warn_at = None
        if now > deadline:
            return "deadline"
        if stopped is not None and stop_look_at is not None and now > stop_look_at:
            said = stopped()
            if said:
                return said
            stop_look_at = now + _STOP_LOOK_S
        if polls > _POLLS_BEFORE_SLEEP:
            time.sleep(_SLEEP_S)
    return None


def _stopped_members(comm: Any, MPI: Any, found: list[int]) -> Callable[[], str | None]:
    """What says which ranks of ``comm`` seen here (``job_ranks``) are stopped, if any,
    and puts their pids in ``found``."""
    members = comm.Get_group().Translate_ranks(list(range(comm.Get_size())),
                                               MPI.COMM_WORLD.Get_group())

    def said() -> str | None:
        stopped = job_ranks.stopped_ranks(members)
        found[:] = [job_ranks.seen_ranks()[rank].pid for rank in stopped]
        return job_ranks.describe_stopped(stopped) if stopped else None

    return said


def _post_verdict(comm: Any, MPI: Any, arrived: bool) -> tuple[Any, bytearray, bytearray]:
    """Post this rank's verdict (1: its barrier completed in time) in the MIN reduction:
    (the request, its send buffer, its receive buffer)."""
    mine = bytearray(int(arrived).to_bytes(4, "little"))
    least = bytearray(4)
    return comm.Iallreduce([mine, MPI.INT], [least, MPI.INT], op=MPI.MIN), mine, least


def wait_for_every_rank(comm: Any, *, warn_after: float | None = None, what: str = "making a group",
                        timeout: float | None = None) -> None:
    """Collective over ``comm``: return once every rank has arrived, or raise on every
    rank that did. A rank still waiting after ``warn_after`` seconds (default: the exchange
    timeout) logs a warning; after
    ``timeout`` seconds (default ``IPCSHARE_ARRIVAL_TIMEOUT``) it gives up.

    Raises:
        ExchangeTimeout: on the ranks that waited, when not every rank arrived in time
            (or, after ``warn_after``, a rank seen here is stopped: named, and its pid in
            the error's ``stopped_pids``, for whoever must wake it on leaving); on a rank
            that arrived after the others gave up, saying so.
    """
    MPI = mpi()
    size = comm.Get_size()
    if size == 1:
        return
    timeout = arrival_timeout() if timeout is None else timeout
    if warn_after is None:
        try:
            warn_after = settings.exchange_timeout()
        except SettingError:   # refused by name at group setup, like the arrival's own
            warn_after = settings.DEFAULT_EXCHANGE_TIMEOUT_S
    start = time.monotonic()
    deadline = start + timeout
    warn_at = start + warn_after if warn_after is not None and warn_after < timeout else None

    def warn() -> None:
        log.warning("%s over %d ranks: rank %d has waited %.0f s for the others to arrive; "
                    "every rank of the communicator must make the group (a rank that took "
                    "another branch never comes). Giving up after %g s (%s)", what, size,
                    comm.Get_rank(), time.monotonic() - start, timeout,
                    settings.ARRIVAL_TIMEOUT)

    # A rank of the job seen stopped (an earlier world told its pid) is given up on once
    # the others have waited the exchange timeout for it: it is not merely late to start.
    stopped_pids: list[int] = []
    stopped = _stopped_members(comm, MPI, stopped_pids)
    barrier = comm.Ibarrier()
    try:
        gave_up = _poll(barrier, deadline, warn_at, warn, stopped,
                        start + warn_after if warn_after is not None else None)
    except BaseException:   # Ctrl-C: tell the others not to go on without this rank
        verdict, *buffers = _post_verdict(comm, MPI, False)
        keep(barrier, verdict, buffers=tuple(buffers))
        raise
    arrived = gave_up is None
    # The verdict: 1 from a rank whose barrier completed in time, 0 from one that gave up.
    # Every rank posts it (the ranks that gave up without waiting for it), so it completes
    # for any rank whose barrier did.
    verdict, mine, least = _post_verdict(comm, MPI, arrived)
    if gave_up not in (None, "deadline"):
        keep(barrier, verdict, buffers=(mine, least))
        error = ExchangeTimeout(f"{what} over {size} ranks: {gave_up}; not every rank "
                                f"arrived within {warn_after:g} s")
        error.stopped_pids = list(stopped_pids)
        raise error
    if not arrived:
        keep(barrier, verdict, buffers=(mine, least))
        raise ExchangeTimeout(
            f"{what} over {size} ranks: not every rank arrived within {timeout:g} s; every "
            "rank of the communicator must make the group (a rank that took another "
            "branch, or left, is the usual cause). Ranks that are just slow to start: raise "
            f"{settings.ARRIVAL_TIMEOUT}")
    # Every rank has posted the verdict or is about to: it needs no long deadline.
    try:
        agreed = _poll(verdict, time.monotonic() + max(timeout, 1.0), None, None) is None
    except BaseException:
        keep(verdict, buffers=(mine, least))
        raise
    if not agreed:
        keep(verdict, buffers=(mine, least))
        raise ExchangeTimeout(f"{what} over {size} ranks: the ranks did not agree that every "
                              f"one arrived within {timeout:g} s")
    if int.from_bytes(least, "little") == 0:
        raise ExchangeTimeout(
            f"{what} over {size} ranks: every rank arrived, but a rank had given up waiting "
            f"before the last one came (after {timeout:g} s, or interrupted), so none goes "
            f"on; every rank must make the group within that time of the first "
            f"({settings.ARRIVAL_TIMEOUT})")
