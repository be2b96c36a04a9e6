"""A job whose ranks' sockets a relay takes over after the first window (used by tests).

Usage: ``mpiexec -n N unshare -p -f --mount-proc python relay_job.py SECONDS``

After a first window (every rank's socket is up), rank 0 starts ``socket_relay.py --once``
in a PID namespace of its own (a process of the same user that is no rank), which swaps
every rank's socket for its own relay. Then every rank makes a second window, writes
``SECRET-of-rank-R`` into its memory and reads its peers'. Each rank prints ``RANK r ok``
with what it read, or ``RANK r failed: <error>``; rank 0 then prints the relay's
``swapped S stolen N``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import ipcshare

RELAY = Path(__file__).with_name("socket_relay.py")


def main() -> int:
    seconds = sys.argv[1]
    relay = None
    status = 0
    with ipcshare.Group(backend="host", exchange="socket") as group:
        try:
            group.window(4096).close()  # every rank's socket is up
            if group.rank == 0:
                folder = os.environ["IPCSHARE_SOCKET_DIR"]
                relay = subprocess.Popen(["unshare", "-p", "-f", "--mount-proc",
                                          "--kill-child=SIGTERM", sys.executable,
                                          str(RELAY), folder, seconds, "--once"],
                                         stdout=subprocess.PIPE, text=True)
                assert relay.stdout.readline().strip() == "ready"
            group.barrier()
            with group.window(64) as window:
                mine = f"SECRET-of-rank-{group.rank}".encode()
                np.asarray(window.local)[:len(mine)] = np.frombuffer(mine, np.uint8)
                window.barrier()
                seen = [bytes(np.asarray(window.peer(r))[:20]).rstrip(b"\0").decode(
                    errors="replace") for r in range(group.size)]
                window.barrier()
            print(f"RANK {group.rank} ok read {seen}", flush=True)
        except Exception as exc:
            print(f"RANK {group.rank} failed: {type(exc).__name__}: {exc}", flush=True)
            status = 3
        finally:
            if relay is not None:
                relay.terminate()
                said, _ = relay.communicate(timeout=30)
                print(said.strip(), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
