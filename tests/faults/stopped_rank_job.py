"""A job that keeps meeting until its harness stops one rank (used by tests and
tools/checks/socket_attacks.py).

Usage: ``mpiexec -n N python stopped_rank_job.py SECONDS [before-group]``

Each rank prints ``RANK r pid P`` once its group is up, then meets the others in windows
and barriers for SECONDS. The harness SIGSTOPs one rank meanwhile: the others must end
with one line naming it and leave without MPI_Finalize (which would wait for the
stopped rank for ever). Each rank prints ``RANK r done`` or ``RANK r failed: <error>``
(then its exit status is not 0).

``before-group``: rank 1 stops itself between a first meeting of the ranks (a ``World``,
as the CLI's first agreements make) and the group, where the others wait for every rank
to arrive; each rank prints ``RANK r pid P`` before that.
"""

from __future__ import annotations

import os
import sys
import time

import ipcshare


def say(line: str) -> None:
    """One line in one write: the launcher merges every rank's output into one stream,
    where a line written in parts can be cut by another rank's."""
    os.write(1, (line + "\n").encode())


def main() -> int:
    seconds = float(sys.argv[1])
    if sys.argv[2:] == ["before-group"]:
        return before_group()
    with ipcshare.Group(backend="host", exchange="socket") as group:
        say(f"RANK {group.rank} pid {os.getpid()}")
        try:
            ends = time.monotonic() + seconds
            while time.monotonic() < ends:
                with group.window(4096) as window:
                    window.barrier()
                group.barrier()
        except Exception as exc:
            say(f"RANK {group.rank} failed: {type(exc).__name__}: {exc}")
            raise SystemExit(3) from None
    say(f"RANK {group.rank} done")
    return 0


def before_group() -> int:
    import signal

    from ipcshare.topology.world import World

    world = World.from_comm()
    rank = world.rank
    world.close()
    say(f"RANK {rank} pid {os.getpid()}")
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        with ipcshare.Group(backend="host", exchange="socket"):
            pass
    except Exception as exc:
        say(f"RANK {rank} failed: {type(exc).__name__}: {exc}")
        raise SystemExit(3) from None
    say(f"RANK {rank} done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
