"""A job whose descriptor socket gets bytes from a process outside the job (used by tests).

Usage: ``mpiexec -n N [unshare -p -f --mount-proc] python stranger_job.py WHAT``

After a first window (which sets up every rank's socket), rank 0 starts a process that
is no rank of the job (same user) and has it knock on rank 1's socket: ``WHAT`` is
``garbage`` (3 bytes), ``header`` (a well-formed header under a wrong secret, with a
descriptor) or ``silent`` (connects and closes). Then every rank makes a second window,
which must work. Each rank prints ``RANK r ok refused=K`` (K: connections it turned
away) or ``RANK r failed: <error>`` and exits with status 0 or 3.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import ipcshare

FAILED = 3

STRANGER = """
import os, socket, struct, sys
address, what = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(address.encode().replace(b"@", b"\\0", 1) if address.startswith("@") else address)
if what == "garbage":
    s.sendall(b"abc")
elif what == "header":
    fields = struct.pack("!4s16sIQ", b"IPCS", sys.argv[3].encode(), 1, 2)
    socket.send_fds(s, [fields + bytes(16) + bytes(32)], [os.memfd_create("bait")])
s.close()
"""


def main() -> int:
    what = sys.argv[1]
    with ipcshare.Group(backend="host", exchange="socket") as group:
        try:
            group.window(4096).close()  # every rank's socket is up
            endpoint = group.exchange._endpoint
            if group.rank == 0:
                address = endpoint.describe_address(group.world.local_index(1))
                subprocess.run([sys.executable, "-c", STRANGER, address, what,
                                group.exchange.token], check=True, timeout=30)
            group.barrier()
            with group.window(4096) as window:
                np.asarray(window.peer((group.rank + 1) % group.size))[0] = 7
                window.barrier()
                assert np.asarray(window.local)[0] == 7
            refused = len(group.exchange.refused_connections)
        except Exception as exc:
            print(f"RANK {group.rank} failed: {type(exc).__name__}: {exc}", flush=True)
            return FAILED
    print(f"RANK {group.rank} ok refused={refused}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
