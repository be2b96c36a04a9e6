"""Collectives fail together: after each step every rank learns whether any rank failed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from ..runtime.errors import (
    CollectiveFailure,
    ExchangeTimeout,
    IpcShareError,
    PeerDied,
    SettingError,
    WindowError,
    error_class,
    error_facts,
)
from ..runtime.logs import get_logger
from ..topology.world import World, describe_disagreement, format_ranks
from .deadline_waits import give_up_on_group, watched_allgather
from .pidfd_watch import PeerWatch

__all__ = ["agree", "collective_step", "failure_suffix", "check_same_step", "Rendezvous",
           "LEAVE_GRACE_S"]

log = get_logger("liveness")


def failure_suffix(ranks: list[int]) -> str:
    """What ends a fail-together message: the ranks that reported the failure,
    ``' (reported by ranks 0-1)'``, or nothing when only the named rank did."""
    return f" (reported by {format_ranks(ranks)})" if len(ranks) > 1 else ""


def check_same_step(tags: list[tuple[str, str]], ranks: list[int]) -> None:
    """Raise on every rank (each sees the same list) when the ranks met in different
    steps: one rank's collective was matched with another on another rank, which would
    otherwise surface as errors about values nobody passed. A tag is ``(kind, name)``:
    a fail-together step or a plain collective, and the step's name; every payload is
    ``(tag, value)``, so a step and a collective read each other's tags too.

    Raises:
        WindowError: naming each rank's step.
    """
    if len(set(tags)) > 1:
        raise WindowError(
            "ranks are in different collective steps: "
            + describe_disagreement([name for _kind, name in tags], verb=("is in", "are in"),
                                    then="in", spell=repr, ranks=ranks)
            + ": every rank must make the group's collective calls (window, communicator, "
            "register, barrier, close) in the same order")


def agree(world: World, step: str, error: BaseException | None, *, comm=None,
          watch: PeerWatch | None = None, timeout: float = 30.0,
          extra_while_running: float = 0.0) -> None:
    """Collective: raise the same typed error on every rank if any rank failed ``step``.

    The message names the first failing rank, its host, the step and the cause, e.g.
    ``import failed on rank 1@node3: cuMemImportFromShareableHandle -> CUDA_ERROR_...``;
    when several ranks failed it ends with the ones that did, e.g.
    ``(reported by ranks 0-1, 3)``. The error's ``failure`` holds the same as typed
    facts (step, rank, host, the failing ranks, and the failing rank's errno and CUDA
    error names), for readers that must not parse the message.

    With a ``watch``, waiting for the others gives up when one of them dies (PeerDied)
    or after ``timeout`` seconds (ExchangeTimeout) instead of hanging; after
    ``extra_while_running`` seconds more where no watched peer is stopped (a step in which
    one rank is known to be busy: ``deadline_waits.wait_request``).

    This rank's ``error`` a timeout (a wait of the step) while a watched peer is
    stopped: that peer cannot take part, so this rank raises at once, naming it, instead
    of waiting another timeout for it.

    Raises:
        IpcShareError (or the failing rank's subclass of it): when any rank failed.
        PeerDied / ExchangeTimeout: with a watch, as above.
    """
    stopped = watch.stopped_ranks() if (watch is not None and error is not None
                                        and isinstance(error, TimeoutError)) else []
    if stopped:
        # This rank waited a whole timeout already, and a peer is stopped: that peer
        # cannot agree either, so waiting another timeout for it would only delay the
        # line. Every other survivor times out by itself, or sees this rank leave.
        reason = f"{step}: {watch.describe_stopped(stopped)}; {error}"
        give_up_on_group(watch, reason)
        raise ExchangeTimeout(reason) from error
    comm = world.comm if comm is None else comm
    status = None
    if error is not None:
        # The facts travel beside the text: other ranks cannot read this rank's causes.
        # The last field: it is a step's agreed error already (a step inside this one).
        status = (type(error).__name__, str(error) or type(error).__name__,
                  error_facts(error), getattr(error, "failure", None) is not None)
    mine = (("step", step), (world.rank, status))
    if watch is None:
        tagged = comm.allgather(mine)
    else:
        tagged = watched_allgather(comm, mine, watch=watch, timeout=timeout, what=step,
                                   extra_while_running=extra_while_running)
    check_same_step([tag for tag, _payload in tagged],
                    [payload[0] if tag[0] == "step" else index
                     for index, (tag, payload) in enumerate(tagged)])
    statuses = [payload for _tag, payload in tagged]
    failures = [(rank, s) for rank, s in statuses if s is not None]
    if not failures:
        return
    if (error is not None and len(failures) == len(statuses)
            and all(s[3] for _rank, s in failures)
            and len({(s[0], s[1]) for _rank, s in failures}) == 1):
        # Every rank raised the same agreed error of a step inside this one, which names
        # the failing rank and cause already: wrapping it again would say it twice. (Steps
        # over a node's ranks agree per node: different errors are wrapped as usual.)
        raise error
    rank, (name, message, facts, _agreed) = failures[0]
    failed = [r for r, _status in failures]
    cls = error_class(name)  # an OSError on one rank becomes IpcShareError everywhere
    exc = cls(f"{step} failed on {world.where(rank)}: {message}{failure_suffix(failed)}")
    if isinstance(exc, SettingError) and facts.setting:  # the variable, on every rank
        exc.setting, exc.value = facts.setting["name"], facts.setting["value"]
    exc.failure = CollectiveFailure(step=step, rank=rank, host=world.hostnames[rank],
                                    ranks=tuple(failed), facts=facts)
    if error is not None:
        raise exc from error
    raise exc


@contextlib.contextmanager
def collective_step(world: World, step: str, *, comm=None, watch: PeerWatch | None = None,
                    timeout: float = 30.0, extra_while_running: float = 0.0) -> Iterator[None]:
    """Run the body on every rank, then agree: all ranks raise if any rank raised
    (``agree``, which says what ``extra_while_running`` is for).

    Raises:
        as ``agree``: when any rank raised in the body.
    """
    try:
        yield
    except Exception as exc:
        if isinstance(exc, PeerDied) or (watch is not None and watch.failed):
            # A dead rank cannot agree, and an abandoned collective leaves the
            # communicator unusable: every survivor finds out by itself.
            raise
        agree(world, step, exc, comm=comm, watch=watch, timeout=timeout,
              extra_while_running=extra_while_running)
        raise  # agree always raises when exc is set; keeps type checkers honest
    else:
        agree(world, step, None, comm=comm, watch=watch, timeout=timeout,
              extra_while_running=extra_while_running)


# How long a rank leaving on an error of its own waits for its peers in a closing barrier
# (long enough for kernels in flight to finish reading its memory).
LEAVE_GRACE_S = 2.0


class Rendezvous:
    """The fail-together collectives of a group of ranks (``world``), each of which
    gives up on a dead peer (PeerDied, through ``watch``) or after ``timeout`` seconds
    (ExchangeTimeout) instead of hanging: what a group and its windows meet by."""

    def __init__(self, world: World, watch: PeerWatch | None, timeout: float) -> None:
        self.world = world
        self.watch = watch
        self.timeout = timeout
        # Set while this rank leaves on an error of its own: its closing barriers wait
        # that long at most (``close_on_exit``).
        self.grace: float | None = None

    def step(self, name: str):
        """``collective_step`` over the world: every rank raises if any rank raised.

        Raises:
            WindowError: the group stopped meeting (``check_usable``).
        """
        self.check_usable(name)
        return collective_step(self.world, name, watch=self.watch, timeout=self.timeout)

    def collective(self, what: str, value, *, comm=None, timeout: float | None = None) -> list:
        """Collective allgather of ``value`` over ``comm`` (default: the world's), waiting
        ``timeout`` seconds (default: the group's).

        Raises:
            WindowError: the group stopped meeting (``check_usable``).
        """
        self.check_usable(what)
        comm = self.world.comm if comm is None else comm
        tagged = watched_allgather(comm, (("collective", what), value), watch=self.watch,
                                   timeout=self.timeout if timeout is None else timeout,
                                   what=what)
        ranks = (self.world.local_ranks if comm is self.world.local_comm
                 else list(range(len(tagged))))
        check_same_step([tag for tag, _value in tagged], ranks)
        return [value for _tag, value in tagged]

    def barrier(self, what: str) -> None:
        """Collective, host-blocking: an MPI barrier over the world.

        Raises:
            WindowError: the group stopped meeting (``check_usable``).
        """
        self.collective(what, None)   # an allgather of the step's name: crossed calls show

    def check_usable(self, what: str) -> None:
        """Refuse a new collective once the group failed (a peer died, a collective was
        abandoned, a call timed out): its communicators may hold requests that will never
        complete, and a new collective would be matched with an old one on some rank,
        giving errors about values nobody passed.

        Raises:
            PeerDied: a peer of this node died (the same error a rank already inside a
                step gets, so that a rank arriving late is told alike).
            WindowError: naming the failure and what to do.
        """
        if self.watch is not None and self.watch.failed:
            self.watch.check(what)
            raise WindowError(f"{what}: this group can no longer meet: {self.watch.failed}; "
                              "close it and make a new Group on every rank")

    def wait_for_node(self, what: str) -> None:
        """Barrier over the node's ranks, skipped once the group has failed (a dead
        peer would never arrive)."""
        if self.watch is not None and self.watch.failed:
            return
        timeout = self.timeout if self.grace is None else min(self.timeout, self.grace)
        self.collective(what, None, comm=self.world.local_comm, timeout=timeout)

    def close_on_exit(self, error: BaseException | None, close: Callable[[], None],
                      what: str, *, inner: tuple[Rendezvous, ...] = ()) -> None:
        """``close`` as a with-block ends. Leaving on an error that every rank raised
        together (agreement), every rank is closing: close as usual. Leaving on an error
        of this rank alone (the user's own exception, Ctrl-C, a timeout), the others are
        elsewhere: the closing barriers wait ``LEAVE_GRACE_S`` at most instead of the full
        timeout, and a close that fails too is logged, never raised in place of the
        error the user needs to see. ``inner``: the rendezvous of groups that ``close``
        closes too (a communicator's node group), whose barriers get the same grace.
        """
        if error is None:
            close()
            return
        meetings = (self, *inner)
        saved = [meeting.grace for meeting in meetings]
        if not (isinstance(error, IpcShareError) and error.failure is not None):
            for meeting in meetings:
                meeting.grace = LEAVE_GRACE_S
        try:
            close()
        except Exception as close_error:
            log.warning("%s after %s failed too: %s: %s", what, type(error).__name__,
                        type(close_error).__name__, close_error)
        finally:
            for meeting, grace in zip(meetings, saved, strict=True):
                meeting.grace = grace   # this close only: later closes wait in full
