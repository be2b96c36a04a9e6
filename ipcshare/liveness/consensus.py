"""Collectives fail together: after each step every rank learns whether any rank failed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..runtime.errors import CollectiveFailure, PeerDied, error_class, error_facts
from ..topology.world import World, format_ranks
from .deadline_waits import watched_allgather, watched_barrier
from .pidfd_watch import PeerWatch

__all__ = ["agree", "collective_step", "failure_suffix", "Rendezvous"]


def failure_suffix(ranks: list[int]) -> str:
    """What ends a fail-together message: the ranks that reported the failure,
    ``' (reported by ranks 0-1)'``, or nothing when only the named rank did."""
    return f" (reported by {format_ranks(ranks)})" if len(ranks) > 1 else ""


def agree(world: World, step: str, error: BaseException | None, *, comm=None,
          watch: PeerWatch | None = None, timeout: float = 30.0) -> None:
    """Collective: raise the same typed error on every rank if any rank failed ``step``.

    The message names the first failing rank, its host, the step and the cause, e.g.
    ``import failed on rank 1@node3: cuMemImportFromShareableHandle -> CUDA_ERROR_...``;
    when several ranks failed it ends with the ones that did, e.g.
    ``(reported by ranks 0-1, 3)``. The error's ``failure`` holds the same as typed
    facts (step, rank, host, the failing ranks, and the failing rank's errno and CUDA
    error names), for readers that must not parse the message.

    With a ``watch``, waiting for the others gives up when one of them dies (PeerDied)
    or after ``timeout`` seconds (ExchangeTimeout) instead of hanging.

    Raises:
        IpcShareError (or the failing rank's subclass of it): when any rank failed.
        PeerDied / ExchangeTimeout: with a watch, as above.
    """
    comm = world.comm if comm is None else comm
    status = None
    if error is not None:
        # The facts travel beside the text: other ranks cannot read this rank's causes.
        # The last field: it is a step's agreed error already (a step inside this one).
        status = (type(error).__name__, str(error) or type(error).__name__,
                  error_facts(error), getattr(error, "failure", None) is not None)
    if watch is None:
        statuses = comm.allgather((world.rank, status))
    else:
        statuses = watched_allgather(comm, (world.rank, status), watch=watch, timeout=timeout,
                                     what=step)
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
    exc.failure = CollectiveFailure(step=step, rank=rank, host=world.hostnames[rank],
                                    ranks=tuple(failed), facts=facts)
    if error is not None:
        raise exc from error
    raise exc


@contextlib.contextmanager
def collective_step(world: World, step: str, *, comm=None, watch: PeerWatch | None = None,
                    timeout: float = 30.0) -> Iterator[None]:
    """Run the body on every rank, then agree: all ranks raise if any rank raised."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, PeerDied) or (watch is not None and watch.failed):
            # A dead rank cannot agree, and an abandoned collective leaves the
            # communicator unusable: every survivor finds out by itself.
            raise
        agree(world, step, exc, comm=comm, watch=watch, timeout=timeout)
        raise  # agree always raises when exc is set; keeps type checkers honest
    else:
        agree(world, step, None, comm=comm, watch=watch, timeout=timeout)


class Rendezvous:
    """The fail-together collectives of a group of ranks (``world``), each of which
    gives up on a dead peer (PeerDied, through ``watch``) or after ``timeout`` seconds
    (ExchangeTimeout) instead of hanging: what a group and its windows meet by."""

    def __init__(self, world: World, watch: PeerWatch | None, timeout: float) -> None:
        self.world = world
        self.watch = watch
        self.timeout = timeout

    def step(self, name: str):
        """``collective_step`` over the world: every rank raises if any rank raised."""
        return collective_step(self.world, name, watch=self.watch, timeout=self.timeout)

    def collective(self, what: str, value, *, comm=None) -> list:
        """Collective allgather of ``value`` over ``comm`` (default: the world's)."""
        return watched_allgather(self.world.comm if comm is None else comm, value,
                                 watch=self.watch, timeout=self.timeout, what=what)

    def barrier(self, what: str) -> None:
        """Collective, host-blocking: an MPI barrier over the world."""
        watched_barrier(self.world.comm, watch=self.watch, timeout=self.timeout, what=what)

    def wait_for_node(self, what: str) -> None:
        """Barrier over the node's ranks, skipped once the group has failed (a dead
        peer would never arrive)."""
        if self.watch is not None and self.watch.failed:
            return
        watched_barrier(self.world.local_comm, watch=self.watch, timeout=self.timeout,
                        what=what)
