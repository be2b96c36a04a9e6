"""A pattern run in which one rank's wait times out while the others go on (used by tests).

Usage: ``mpiexec -n N python late_rank_job.py``

Rank 0 dawdles in its last check of the first size for ``LATE_S`` seconds (0.5), longer
than the signal timeout the test sets (0.05 s): the other ranks, waiting for it in the
window barrier that ends the checks, time out, while rank 0 then finds their signals
there and goes on into the driver's next collective. Every rank prints
``RANK r: <ErrorType>: <message>`` and exits with status 3; a rank that hangs is caught
by the test's timeout.
"""

from __future__ import annotations

import os
import sys
import time

import ipcshare
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options

FAILED = 3


def main() -> int:
    late = float(os.environ.get("LATE_S", "0.5"))
    options = merge_options({}, {"backend": "host", "exchange": "socket", "min_bytes": 1024,
                                 "max_bytes": 1024, "iters": 2, "warmup": 1, "checks": 2})
    with ipcshare.Group(backend="host", exchange="socket") as group:
        pattern = make_pattern("ring", "auto")
        check = pattern.check

        def dawdling_check(region, plan, mode, iteration):
            if group.rank == 0 and iteration == options.checks - 1:
                time.sleep(late)
            return check(region, plan, mode, iteration)

        pattern.check = dawdling_check
        try:
            run_pattern(group, pattern, options, emit=lambda _line: None)
        except Exception as exc:
            print(f"RANK {group.rank}: {type(exc).__name__}: {exc}", flush=True)
            return FAILED
    print(f"RANK {group.rank}: no error", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
