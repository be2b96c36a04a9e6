"""Another local user trying to take a job's descriptors (used by tests).

Usage: ``python socket_thief.py UID GID FOLDER SECONDS``

Becomes user UID, then for SECONDS, or until SIGTERM (the test sends it once the job has
ended), watches FOLDER (the job's IPCSHARE_SOCKET_DIR) for the job's ``ipcshare-*``
directory: renames it away, makes one of the same name, binds ``r0.sock`` … ``r3.sock``
there and collects whatever descriptors are sent to them, the connections still waiting
to be accepted included. Prints ``renamed R stolen N`` at the end (N: descriptors
received).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time


def _take_descriptors(listeners: list[socket.socket]) -> tuple[int, int]:
    """Accept one waiting connection on each listener: (connections, descriptors
    received)."""
    accepted = stolen = 0
    for listener in listeners:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            continue
        accepted += 1
        with conn:
            conn.settimeout(1)
            try:
                _data, fds, _flags, _ = socket.recv_fds(conn, 4096, 4)
            except OSError:
                fds = []
            stolen += len(fds)
    return accepted, stolen


def main() -> int:
    uid, gid, folder, seconds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    told_to_stop = []
    signal.signal(signal.SIGTERM, lambda *_: told_to_stop.append(True))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    listeners: list[socket.socket] = []
    renamed = stolen = 0
    while time.monotonic() < deadline and not told_to_stop:
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if not name.startswith("ipcshare-") or name.endswith(".stolen"):
                continue
            if os.stat(path).st_uid == uid:
                continue  # ours already
            try:
                os.rename(path, path + ".stolen")
                os.mkdir(path, 0o777)
                os.chmod(path, 0o777)
            except OSError:
                continue  # sticky folder: not ours to rename
            renamed += 1
            for rank in range(4):
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(os.path.join(path, f"r{rank}.sock"))
                os.chmod(os.path.join(path, f"r{rank}.sock"), 0o777)
                listener.listen(8)
                listener.setblocking(False)
                listeners.append(listener)
        stolen += _take_descriptors(listeners)[1]
        time.sleep(0.0005)
    # Whatever the job sent before it ended waits in the listeners' backlogs.
    accepted = 1
    while accepted:
        accepted, taken = _take_descriptors(listeners)
        stolen += taken
    print(f"renamed {renamed} stolen {stolen}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
