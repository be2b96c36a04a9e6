"""The ways one rank's memory can reach another's, as the doctor names and opens them.

Each path is a ``Group`` configuration users can run themselves (backend, exchange,
handle type), so the doctor exercises the same code as ``ipcshare ring``. Groups here
live on a node's communicator (or a pair of its ranks), whose rank numbers differ from
the job's: messages are translated back to world ranks before anyone reads them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..runtime.errors import IpcShareError, error_facts
from ..topology.world import format_ranks, parse_ranks

__all__ = [
    "PathSpec",
    "HOST_PATHS",
    "GPU_PATHS",
    "PATHS_BY_NAME",
    "open_group",
    "close_window_together",
    "close_group_noting",
    "translate_ranks",
    "describe_failure",
]


@dataclasses.dataclass(frozen=True)
class PathSpec:
    """One way of sharing memory: ``Group(backend, exchange, handle=handle)``."""

    name: str
    backend: str
    exchange: str
    handle: str = "posix-fd"
    gpu: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


HOST_PATHS = (
    PathSpec("host-shm", "host", "auto"),          # what users get: pidfd, else sockets
    PathSpec("posix-fd/pidfd", "host", "pidfd"),   # descriptors forced through pidfd_getfd
    PathSpec("posix-fd/socket", "host", "socket"),  # ... and through SCM_RIGHTS
)
GPU_PATHS = (
    PathSpec("cuda-ipc", "cuda-ipc", "auto", gpu=True),
    PathSpec("cuda-vmm/pidfd", "cuda-vmm", "pidfd", gpu=True),
    PathSpec("cuda-vmm/socket", "cuda-vmm", "socket", gpu=True),
    PathSpec("fabric", "cuda-vmm", "auto", handle="fabric", gpu=True),
)
PATHS_BY_NAME = {spec.name: spec for spec in HOST_PATHS + GPU_PATHS}


def open_group(spec: PathSpec, comm: Any, *, timeout: float, world_rank: int):
    """Collective over ``comm``: a ``Group`` for ``spec``.

    Raises:
        IpcShareError: on every rank of ``comm`` when any rank failed (as Group does).
    """
    from ..runtime.logs import configure_logging
    from ..window import Group

    try:
        return Group(spec.backend, spec.exchange, comm=comm, handle=spec.handle,
                     timeout=timeout)
    finally:
        # A group's World labels logs with its own rank numbers; put the job's back.
        configure_logging(world_rank)


def close_window_together(window: Any) -> str | None:
    """Close ``window`` so that its node barrier is met even when this rank's engine is
    broken (a GPU fault makes every later synchronize fail, and Window.close would then
    raise before its barrier, leaving the peers waiting). Returns the error, if any."""
    try:
        window.engine.synchronize()
    except Exception as exc:
        comm = window.world.local_comm
        try:
            window.close()
        except Exception:
            pass  # it raised before its barrier: meet the peers here instead
        comm.Barrier()
        return f"{type(exc).__name__}: {exc}"
    try:
        window.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def close_group_noting(group: Any, record: dict[str, Any]) -> None:
    """Close a probe's ``group``; a failure of this rank's local release (after the
    collective part) goes into ``record["close_error"]`` instead of raising."""
    try:
        group.close()
    except Exception as exc:
        record["close_error"] = f"{type(exc).__name__}: {exc}"


# ``rank 1@n3``, ``rank 3``, ``ranks 0-1, 3`` (as topology.format_ranks writes them);
# a local rank is a node's number, not the communicator's. Only the text people read is
# rewritten with it: the facts rules read come typed (``describe_failure``).
_RANK_MENTION = re.compile(r"(?<!local )\branks? \d+(?:-\d+)?(?:, \d+(?:-\d+)?)*")


def translate_ranks(text: str, members: list[int]) -> str:
    """Rewrite ``rank K@host`` and lists such as ``ranks 0-1, 3`` (ranks of a
    sub-communicator) as the job's ranks, for people to read."""
    def world(match: re.Match) -> str:
        ranks = parse_ranks(match.group(0))
        return format_ranks(_job_rank(r, members) for r in ranks)
    return _RANK_MENTION.sub(world, text)


def _job_rank(rank: int, members: list[int]) -> int:
    return members[rank] if rank < len(members) else rank


def describe_failure(exc: BaseException, members: list[int]) -> dict[str, Any]:
    """The failing step, rank (world numbering), error class and message of a
    collective error, the typed facts of the failing rank's error (``errno``,
    ``cuda_error``, ``peer_unreachable``: what the rules read), plus this rank's own
    cause when it is one of the failing ranks.

    The step and rank are those that fail-together agreement recorded (``exc.failure``);
    an error that no agreement raised (a dead peer, a timeout) is ``setup`` with no rank.
    """
    agreed = exc.failure if isinstance(exc, IpcShareError) else None
    if agreed is None:
        step, rank, facts = "setup", None, error_facts(exc)
    else:
        step, rank, facts = agreed.step, _job_rank(agreed.rank, members), agreed.facts
    failure: dict[str, Any] = {"step": step, "rank": rank, "error": type(exc).__name__,
                               "message": translate_ranks(str(exc), members),
                               **facts.to_dict()}
    cause = exc.__cause__
    if cause is not None:  # consensus re-raises with the local error as the cause
        failure["local_cause"] = translate_ranks(f"{type(cause).__name__}: {cause}", members)
    return failure
