"""The job's ranks that this process can see: those on its host whose pid names the same
process here (not one in another PID namespace), with the start time that proves it,
learned from every world made (``World.from_comm``). A rank that leaves without
MPI_Finalize waits for them to have spoken (``liveness.exit_policy``); a wait for the
ranks to arrive gives up early on one of them that is stopped (``arrival``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .process_state import process_is_stopped, process_start_time

__all__ = ["SeenRank", "note_ranks", "seen_ranks", "every_rank_seen", "stopped_ranks",
           "describe_stopped"]


@dataclass(frozen=True)
class SeenRank:
    """A rank of the job on this host: its host name, pid and start time (clock ticks
    since boot, ``process_state.process_start_time``)."""

    host: str
    pid: int
    start_time: int


# Job rank (MPI.COMM_WORLD's) -> what this process saw of it; and the job's rank count.
_seen: dict[int, SeenRank] = {}
_job_size = 0


def note_ranks(job_ranks: Sequence[int], hosts: Sequence[str], pids: Sequence[int],
               start_times: Sequence[int | None], *, own_job_rank: int, job_size: int,
               host: str) -> None:
    """Remember the ranks a world's ranks told each other about (job ranks, hosts, pids,
    start times) that this process can see: on ``host``, and whose pid here is the process
    that started then. The job has ``job_size`` ranks; this one is ``own_job_rank``."""
    global _job_size
    _job_size = job_size
    for job_rank, where, pid, started in zip(job_ranks, hosts, pids, start_times,
                                             strict=True):
        if (job_rank == own_job_rank or where != host or started is None
                or job_rank in _seen or process_start_time(pid) != started):
            continue
        _seen[job_rank] = SeenRank(where, pid, started)


def seen_ranks() -> dict[int, SeenRank]:
    """The other ranks of the job seen here, by job rank."""
    return dict(_seen)


def every_rank_seen() -> bool:
    """Whether this process sees every other rank of the job (all on its host, in its
    PID namespace, and named by a world made here)."""
    return _job_size > 0 and len(_seen) + 1 >= _job_size


def stopped_ranks(job_ranks: Iterable[int]) -> list[int]:
    """Those of ``job_ranks`` seen here whose process is stopped (SIGSTOP, a debugger),
    read from /proc now."""
    found = []
    for job_rank in job_ranks:
        seen = _seen.get(job_rank)
        if (seen is not None and process_is_stopped(seen.pid)
                and process_start_time(seen.pid) == seen.start_time):
            found.append(job_rank)
    return found


def describe_stopped(job_ranks: Sequence[int]) -> str:
    """``rank 1@h (pid N) stopped responding (its process is stopped: ...)`` for the
    stopped ``job_ranks`` (seen here), as a peer watch says it."""
    names = ", ".join(f"rank {r}@{_seen[r].host} (pid {_seen[r].pid})" for r in job_ranks)
    return f"{names} stopped responding (its process is stopped: SIGSTOP, or a debugger)"
