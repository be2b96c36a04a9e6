"""A guard process that ends a rank stuck in a call that cannot notice a dead peer.

A rank blocked inside an MPI collective that holds the interpreter lock (mpi4py's
lower-case ``allreduce`` runs its reduction in Python) cannot run any Python code, not
even another thread: only another process can free it. The guard is started once per
group by ``PeerWatch.exit_if_stuck``; it watches the node's peers and its rank through
pidfds and reads commands from a pipe (``clean-sockets TOKEN DIR``, ``done``). When a
peer dies and the rank has not said ``done`` within the grace period, the guard writes
one line naming the dead rank, removes the job's socket directories it was told of (only
what the job put there: ``exchange.socket_dir``) and SIGKILLs the rank.

The program is ``python -m ipcshare.exchange.peer_guard SPEC_JSON`` (with the command pipe
on stdin and the pidfds named in SPEC_JSON inherited): it sits in the exchange, above this
floor, and hands this loop the exchange's own removal of its socket directory, which
liveness must not import.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
from collections.abc import Callable

from ..topology.process_state import process_is_stopped

__all__ = ["run_guard"]


def run_guard(argv: list[str] | None, *, remove_socket_dir: Callable[[str, str], object]) -> int:
    """Guard one rank as SPEC_JSON (``argv[0]``) says; returns the process's exit status.
    ``remove_socket_dir(directory, token)`` removes a socket directory the rank named."""
    spec = json.loads((argv or sys.argv[1:])[0])
    # The launcher's failure notices and the terminal's ^C are for the ranks, not us.
    for number in (signal.SIGUSR1, signal.SIGINT):
        signal.signal(number, signal.SIG_IGN)
    grace = float(spec["grace"])
    # The rank hands us its own pidfds (inherited): no pid can be reused under us, and a
    # peer that died before we started is still seen as dead.
    rank_fd = int(spec["rank_pidfd"])
    peers = {int(fd): name for fd, name in spec["peers"].items()}
    commands = sys.stdin.fileno()
    socket_dirs: list[tuple[str, str]] = []  # (token, directory)
    pending = b""
    dead: list[str] = []
    poller = select.poll()
    for fd in (rank_fd, commands, *peers):
        poller.register(fd, select.POLLIN)
    deadline_ms: int | None = None
    while True:
        events = poller.poll(deadline_ms)
        if not events:  # the grace ran out: the rank is stuck
            break
        for fd, _mask in events:
            if fd == rank_fd:
                return 0
            if fd == commands:
                chunk = os.read(commands, 4096)
                if not chunk:
                    return 0  # the rank closed the pipe: it is leaving on its own
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line == b"done":
                        return 0
                    if line.startswith(b"clean-sockets "):
                        token, _, directory = os.fsdecode(line[14:]).partition(" ")
                        socket_dirs.append((token, directory))
            else:
                poller.unregister(fd)
                dead.append(peers[fd])
                # A stopped rank cannot say "done" however long it is given.
                deadline_ms = 0 if process_is_stopped(spec["pid"]) else int(grace * 1000)
    poller = select.poll()
    poller.register(rank_fd, select.POLLIN)
    from .mpi_segments import remove_mpi_segments

    for token, directory in socket_dirs:
        remove_socket_dir(directory, token)

    remove_mpi_segments(int(spec["pid"]))
    sys.stderr.write(f"ipcshare: error: {_what_happened(spec, dead, grace)}\n")
    sys.stderr.flush()
    # Let the other survivors' guards speak too before this kill makes the launcher end
    # the job; the rank stays stuck meanwhile (or leaves by itself: then we are done).
    rank_exit = select.poll()
    rank_exit.register(rank_fd, select.POLLIN)
    if rank_exit.poll(int(float(spec.get("linger", 0.2)) * 1000)):
        return 0
    try:
        signal.pidfd_send_signal(rank_fd, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it left on its own
    except AttributeError:  # no pidfd_send_signal here; the rank just lived, so the pid is its
        os.kill(int(spec["pid"]), signal.SIGKILL)
    return 1


def _what_happened(spec: dict, gone: list[str], grace: float) -> str:
    """The guard's one line. Peers that left are said to have died, unless a rank of the
    node is stopped (SIGSTOP, a debugger): then that one stopped responding, and the
    others left because of it (on their own timeouts); this rank may be the stopped one."""
    me = spec["me"]
    stopped = [name for fd, name in spec["peers"].items()
               if name not in gone and process_is_stopped(spec.get("peer_pids", {}).get(fd, 0))]
    if process_is_stopped(spec["pid"]):
        return (f"{me} stopped responding (its process is stopped: SIGSTOP, or a debugger); "
                f"{', '.join(gone)} left the job, so it is ended")
    if stopped:
        return (f"{', '.join(stopped)} stopped responding (its process is stopped: SIGSTOP, "
                f"or a debugger); {', '.join(gone)} left the job; {me} was stuck for "
                f"{grace:g} s in a call that cannot notice it (an MPI collective) and is ended")
    return (f"{', '.join(gone)} died; {me} was stuck for {grace:g} s in a call that cannot "
            "notice it (an MPI collective) and is ended")
