"""A job that keeps meeting until its harness stops one rank (used by tests and
tools/checks/socket_attacks.py).

Usage: ``mpiexec -n N python stopped_rank_job.py SECONDS``

Each rank prints ``RANK r pid P`` once its group is up, then meets the others in windows
and barriers for SECONDS. The harness SIGSTOPs one rank meanwhile: the others must end
with one line naming it and leave without MPI_Finalize (which would wait for the
stopped rank for ever). Each rank prints ``RANK r done`` or ``RANK r failed: <error>``
(then its exit status is not 0).
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


if __name__ == "__main__":
    sys.exit(main())
