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


def main() -> int:
    seconds = float(sys.argv[1])
    with ipcshare.Group(backend="host", exchange="socket") as group:
        print(f"RANK {group.rank} pid {os.getpid()}", flush=True)
        try:
            ends = time.monotonic() + seconds
            while time.monotonic() < ends:
                with group.window(4096) as window:
                    window.barrier()
                group.barrier()
        except Exception as exc:
            print(f"RANK {group.rank} failed: {type(exc).__name__}: {exc}", flush=True)
            raise SystemExit(3) from None
    print(f"RANK {group.rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
