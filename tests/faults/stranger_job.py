"""A job whose descriptor socket gets bytes from a process outside the job (used by tests).

Usage: ``mpiexec -n N [unshare -p -f --mount-proc] python stranger_job.py WHAT [SECONDS]``

After a first window (which sets up every rank's socket), rank 0 starts a process that
is no rank of the job (same user; with ``IPCSHARE_STRANGER_UNSHARE=1`` in a PID
namespace of its own) and has it knock on rank 1's socket: ``WHAT`` is ``garbage`` (3
bytes), ``header`` (a well-formed header under a wrong secret, with a descriptor),
``silent`` (connects and closes), ``hold`` (connects, says nothing and stays connected
through the next window's exchange) or ``replay`` (sends a header that rank 0 really
sent rank 1 in the first window, with the job's secret, captured as a relay would, and
reports how many bytes rank 1 answered). Then every rank makes a second window, which
must work. Each rank prints ``RANK r ok refused=K`` (K: connections it turned away) or
``RANK r failed: <error>`` and exits with status 0 or 3; the replaying stranger prints
``answered N``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

import ipcshare
from ipcshare.exchange.unix_socket import SocketEndpoint

FAILED = 3

STRANGER = """
import os, socket, struct, sys, time
address, what, token, captured = sys.argv[1:5]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(address.encode().replace(b"@", b"\\0", 1) if address.startswith("@") else address)
if what == "garbage":
    s.sendall(b"abc")
elif what == "header":
    fields = struct.pack("!4s16sIIQ", b"IPCS", token.encode(), 0, 1, 2)
    socket.send_fds(s, [fields + bytes(16) + bytes(32)], [os.memfd_create("bait")])
elif what == "hold":
    print("holding", flush=True)
    sys.stdout.close()
    time.sleep(float(sys.argv[5]))
elif what == "replay":
    s.sendall(bytes.fromhex(captured))
    s.settimeout(2)
    answer = b""
    try:
        while chunk := s.recv(4096):
            answer += chunk
    except OSError:
        pass
    print("answered", len(answer), flush=True)
s.close()
"""


def _recording_headers(endpoint: SocketEndpoint) -> list[bytes]:
    """Keep every header ``endpoint`` sends from now on (what a relay would capture)."""
    sent: list[bytes] = []
    header = endpoint._header

    def record(*args):
        sent.append(header(*args))
        return sent[-1]
    endpoint._header = record
    return sent


def main() -> int:
    what = sys.argv[1]
    hold_s = sys.argv[2] if len(sys.argv) > 2 else "0"
    wrapper = (["unshare", "-p", "-f", "--mount-proc"]
               if os.environ.get("IPCSHARE_STRANGER_UNSHARE") == "1" else [])
    with ipcshare.Group(backend="host", exchange="socket") as group:
        stranger = None
        try:
            endpoint = group.exchange._endpoint
            captured = _recording_headers(endpoint) if endpoint is not None else []
            group.window(4096).close()  # every rank's socket is up
            endpoint = group.exchange._endpoint
            captured = [c.hex() for c in captured if group.rank == 0]
            if group.rank == 0:
                address = endpoint.describe_address(group.world.local_index(1))
                command = [*wrapper, sys.executable, "-c", STRANGER, address, what,
                           group.exchange.token, captured[-1] if captured else "", hold_s]
                if what == "hold":  # it stays connected through the next exchange
                    stranger = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
                    assert stranger.stdout.readline().strip() == "holding"
                else:
                    said = subprocess.run(command, check=True, timeout=30,
                                          capture_output=True, text=True).stdout
                    if said:
                        print(said.strip(), flush=True)
            group.barrier()
            with group.window(4096) as window:
                np.asarray(window.peer((group.rank + 1) % group.size))[0] = 7
                window.barrier()
                assert np.asarray(window.local)[0] == 7
            refused = len(group.exchange.refused_connections)
        except Exception as exc:
            print(f"RANK {group.rank} failed: {type(exc).__name__}: {exc}", flush=True)
            return FAILED
        finally:
            if stranger is not None:
                stranger.kill()
                stranger.wait()
    print(f"RANK {group.rank} ok refused={refused}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
