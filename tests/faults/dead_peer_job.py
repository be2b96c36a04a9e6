"""An MPI program in which one rank is SIGKILLed at a chosen moment (used by tests).

Usage: ``mpiexec -n N python dead_peer_job.py MODE VICTIM STAMP_FILE [MARKER]``

MODE says where the victim dies: ``handle-exchange`` or ``descriptor-exchange`` (while
the others build a window with it), ``pattern`` (in the middle of ring steps),
``signal`` (while the others wait for its signal) or ``mpi-collective`` (while the
others sit in a blocking MPI call that cannot notice: the peer guard ends them after
``GRACE`` seconds). ``SLOW_SURVIVOR_S``: the last rank enters the descriptor exchange
that much late (as on a loaded machine), after a faster survivor removed the node's
socket directory; its guard gives it that much more grace. The victim writes the time of
its death to STAMP_FILE. Each survivor prints ``SURVIVOR rank R detected after S s:
<error>`` and exits with status 3; a survivor that never notices would hang (the test has
a timeout). MARKER only tags the command line, so a test can look for leftovers.
``BACKEND`` (default host) and ``EXCHANGE`` (default socket) choose the group's backend
and exchange.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import ipcshare
from ipcshare.liveness.exit_policy import leave_after_peer_death
from ipcshare.runtime.errors import PeerDied
from ipcshare.window import USER_SLOT_BASE

DETECTED = 3


def main() -> int:
    mode, victim, stamp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if os.environ.get("IGNORE_SIGINT"):
        # mpiexec.gforker interrupts the others when one rank dies: ignoring that turns
        # it into a launcher that keeps the job running, as the tests need.
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def die(*_args, **_kwargs) -> None:
        with open(stamp, "w") as out:
            out.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    group = ipcshare.Group(backend=os.environ.get("BACKEND", "host"),
                           exchange=os.environ.get("EXCHANGE", "socket"))
    me, n = group.rank, group.size
    slow = float(os.environ.get("SLOW_SURVIVOR_S", "0")) if me == n - 1 else 0.0
    group.watch.exit_if_stuck(grace=float(os.environ.get("GRACE", "3")) + slow)
    try:
        if mode == "handle-exchange":
            if me == victim:
                group.exchange.share_bytes = die
            group.window(4096)
        elif mode == "descriptor-exchange":
            if me == victim:
                group.exchange.share_fds = die
            elif slow:
                share = group.exchange.share_fds

                def share_late(fd):
                    time.sleep(slow)
                    return share(fd)

                group.exchange.share_fds = share_late
            group.window(4096)
        elif mode == "pattern":
            window = group.window(64 * 1024)
            block = np.full(8, 1, dtype=np.uint8)
            for step in range(10**9):
                if me == victim and step == 300:
                    die()
                window.engine.upload(window.peer((me + 1) % n).slice(0, 8), block)
                window.barrier()
        elif mode == "signal":
            window = group.window(4096)
            window.barrier()
            if me == victim:
                die()
            window.wait_signal(USER_SLOT_BASE, 1, peer=victim, timeout=120)
        elif mode == "mpi-collective":
            window = group.window(4096)
            window.barrier()
            if me == victim:
                die()
            group.world.comm.allreduce(1)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    except PeerDied as exc:
        with open(stamp) as death:
            since = time.time() - float(death.read())
        print(f"SURVIVOR rank {me} detected after {since:.3f} s: {exc}", flush=True)
        group.close()
        leave_after_peer_death(DETECTED, linger=float(os.environ.get("GRACE", "3")) + 0.5)
    print(f"rank {me} finished without noticing a death", flush=True)
    group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
