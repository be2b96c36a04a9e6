"""Noticing dead peers at once: every other rank of the node is watched through a pidfd.

A pidfd turns readable when its process exits, so one background thread blocked in
``poll`` on the node's pidfds learns of a death at once, at no cost to the fast path:
waits read one attribute (``PeerWatch.check``) every few hundred polls (see
``liveness.deadline_waits``). Ranks on other nodes cannot be watched this way; for them
the deadline speaks.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..runtime.errors import PeerDied
from ..runtime.logs import get_logger
from ..topology.process_state import process_is_stopped, process_start_time
from ..topology.world import World
from .failure_notice import (
    note_continuation,
    survive_failure_notices,
    survive_interrupt_after_death,
)
from .mpi_segments import remove_stale_mpi_segments

__all__ = ["PeerWatch", "process_start_time"]

log = get_logger("peers")


class PeerWatch:
    """Watches the other ranks of this node; ``check()`` raises PeerDied once one exits.

    Created collectively by ``PeerWatch.open``. ``failed`` is set when a peer died or a
    collective wait timed out: the group's communicators may then hold requests that
    will never complete, so closing must skip every collective step.
    """

    def __init__(self, world: World, watched: dict[int, int]) -> None:
        self.world = world
        self.failed: str | None = None
        self._pidfds = watched  # pidfd -> world rank
        self._dead: list[int] = []
        self._stopped = threading.Event()
        self._guard: Any = None  # the peer_guard process, once exit_if_stuck armed it
        self._guard_socket_dirs: list[tuple[str, str]] = []  # (token, directory)
        self._wake_read, self._wake_write = os.pipe()
        self._saved_sigusr1 = survive_failure_notices()
        self._saved_sigint = survive_interrupt_after_death(self._peer_exited) if watched else None
        # Set when this process was stopped and continued meanwhile: peers that left
        # then gave up on it, they did not die.
        self.was_stopped = False
        self._saved_sigcont = note_continuation(self._continued) if watched else None
        self._thread: threading.Thread | None = None
        if watched:
            self._thread = threading.Thread(target=self._watch, name="ipcshare-peer-watch",
                                            daemon=True)
            self._thread.start()

    @classmethod
    def open(cls, world: World) -> PeerWatch:
        """Open a pidfd on every other rank of the node (no collective: the world knows
        every rank's pid and start time).

        A peer whose pid does not name the same process here (another PID namespace)
        is left to the deadlines, and so is every rank when pidfds are unavailable.
        """
        start_times = world.start_times  # what every rank told the others of itself
        if world.local_rank == 0:
            # Segments of jobs that their launcher SIGKILLed whole: no rank could unlink
            # them, so the next job on the node does, once no process uses them.
            remove_stale_mpi_segments()
        watched: dict[int, int] = {}
        if hasattr(os, "pidfd_open"):
            for rank in world.local_ranks:
                if rank == world.rank or start_times[rank] is None:
                    continue
                try:
                    pidfd = os.pidfd_open(world.pids[rank])
                except OSError as exc:
                    log.debug("not watching %s: pidfd_open: %s", world.where(rank), exc)
                    continue
                # Checked after opening, so the pid cannot be reused in between.
                if process_start_time(world.pids[rank]) != start_times[rank]:
                    log.debug("not watching %s: pid %d is another process here (another "
                              "PID namespace?)", world.where(rank), world.pids[rank])
                    os.close(pidfd)
                    continue
                watched[pidfd] = rank
        return cls(world, watched)

    @property
    def watched_ranks(self) -> list[int]:
        """World ranks whose death this watch notices at once."""
        return sorted(self._pidfds.values())

    @property
    def dead_ranks(self) -> list[int]:
        return list(self._dead)

    def check(self, doing: str | Callable[[], str] = "") -> None:
        """Raise PeerDied if a watched rank has exited (cheap: reads one attribute).

        ``doing`` (or what it returns, when callable) says what this rank was doing.

        Raises:
            PeerDied: naming the dead rank, its pid and what this rank was doing.
        """
        if self._dead:
            raise PeerDied(self.describe(doing() if callable(doing) else doing))

    def stopped_ranks(self) -> list[int]:
        """Watched ranks whose process is stopped (alive, answering nothing): read from
        /proc now."""
        return [rank for rank in sorted(set(self._pidfds.values()) - set(self._dead))
                if process_is_stopped(self.world.pids[rank])]

    def describe_stopped(self, stopped: list[int]) -> str:
        """``rank 1@h (pid N) stopped responding (its process is stopped)``."""
        world = self.world
        names = ", ".join(f"{world.where(r)} (pid {world.pids[r]})" for r in stopped)
        return (f"{names} stopped responding (its process is stopped: SIGSTOP, or a "
                "debugger)")

    def _continued(self) -> None:
        self.was_stopped = True

    def describe(self, doing: str = "") -> str:
        """What happened to the peers: the dead ones, or, where a peer is stopped, that
        one (the others that left then left because of it, not of their own death), or,
        where this process was stopped itself, that the peers gave up on it."""
        world = self.world
        stopped = self.stopped_ranks()
        if self.was_stopped and self._dead:
            cause = (f"{world.where()} was stopped (SIGSTOP, or a debugger) and continued; "
                     "meanwhile " + ", ".join(world.where(r) for r in self._dead)
                     + " gave up on it and left the job")
        elif stopped:
            cause = self.describe_stopped(stopped)
            gone = [r for r in self._dead if r not in stopped]
            if gone:
                cause += "; " + ", ".join(world.where(r) for r in gone) + " left the job"
        else:
            cause = ", ".join(f"{world.where(r)} (pid {world.pids[r]})"
                              for r in self._dead) + " died"
        if not doing:
            return cause
        here = world.where()
        if doing.startswith(here + " "):
            # A wait's own description ("rank 0@h in ring waiting for ...") already
            # names this rank: say it once.
            return f"{cause} while {here} was {doing[len(here) + 1:]}"
        return f"{cause} while {here} was in {doing}"

    def _peer_exited(self) -> bool:
        """Whether a watched peer has exited, asked of the pidfds themselves (a signal
        handler may run before the watch thread has seen the death)."""
        if self._dead:
            return True
        try:
            return any(select.select(list(self._pidfds), [], [], 0)[0])
        except (OSError, ValueError):  # closed meanwhile
            return False

    def fail(self, reason: str) -> None:
        """Mark the group's communicators unusable (a collective was abandoned)."""
        if self.failed is None:
            self.failed = reason

    def exit_if_stuck(self, *, grace: float) -> None:
        """After a peer's death, have this process ended if it has not closed the watch
        within ``grace`` seconds: it is then stuck in a call that cannot notice (a
        blocking MPI collective), and only another process can free it (see
        ``ipcshare.exchange.peer_guard``). Idempotent; nothing to do on a node of one rank."""
        if self._guard is not None or not self._pidfds or self._stopped.is_set():
            return
        import json
        import subprocess

        world = self.world
        own = os.pidfd_open(os.getpid())
        try:
            spec = {"pid": os.getpid(), "rank_pidfd": own, "grace": grace, "me": world.where(),
                    "peers": {str(fd): f"{world.where(r)} (pid {world.pids[r]})"
                              for fd, r in self._pidfds.items()},
                    "peer_pids": {str(fd): world.pids[r] for fd, r in self._pidfds.items()}}
            self._guard = subprocess.Popen(
                [sys.executable, "-m", "ipcshare.exchange.peer_guard", json.dumps(spec)],
                stdin=subprocess.PIPE, close_fds=True, pass_fds=[own, *self._pidfds])
        finally:
            os.close(own)
        for token, directory in self._guard_socket_dirs:
            self._tell_guard(f"clean-sockets {token} {directory}")

    def remove_on_forced_exit(self, directory: str, token: str) -> None:
        """Have the guard remove the job's socket ``directory`` before it ends a stuck rank.

        The guard removes it as the job itself does (``exchange.socket_dir``): only the
        claim and the sockets, and only when the claim names ``token``.
        """
        self._guard_socket_dirs.append((token, directory))
        self._tell_guard(f"clean-sockets {token} {directory}")

    def _tell_guard(self, line: str) -> None:
        if self._guard is None:
            return
        try:
            self._guard.stdin.write(os.fsencode(line) + b"\n")
            self._guard.stdin.flush()
        except OSError:
            pass  # the guard is gone: nothing left to tell

    def _watch(self) -> None:
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        for pidfd in self._pidfds:
            poller.register(pidfd, select.POLLIN)
        while not self._stopped.is_set():
            events = poller.poll()
            for fd, _mask in events:
                if fd == self._wake_read:
                    return
                poller.unregister(fd)
                rank = self._pidfds[fd]
                # Failed first: whoever sees the death must also see the group as failed.
                self.fail(f"{self.world.where(rank)} died")
                self._dead.append(rank)
                log.debug("%s (pid %d) exited", self.world.where(rank), self.world.pids[rank])

    def close(self) -> None:
        """Stop watching and close the pidfds (idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._guard is not None:
            self._tell_guard("done")
            try:
                self._guard.stdin.close()
                self._guard.wait(timeout=5)
            except Exception:  # the guard leaves on its own when we do
                pass
            self._guard = None
        os.write(self._wake_write, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        for pidfd in self._pidfds:
            os.close(pidfd)
        self._pidfds = {}
        if self._saved_sigusr1 is not None:
            signal.signal(signal.SIGUSR1, self._saved_sigusr1)
            self._saved_sigusr1 = None
        if self._saved_sigint is not None:
            signal.signal(signal.SIGINT, self._saved_sigint)
            self._saved_sigint = None
        if self._saved_sigcont is not None:
            signal.signal(signal.SIGCONT, self._saved_sigcont)
            self._saved_sigcont = None
        os.close(self._wake_read)
        os.close(self._wake_write)

    def __enter__(self) -> PeerWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
