"""Noticing dead peers: every rank of the node is watched through a pidfd, and every wait
ipcshare does on another rank has a deadline and asks the watch first.

A plain MPI collective or a spin on a signal word waits forever for a rank that was
SIGKILLed (unless the launcher kills the whole job for us, which hydra does only by
default). A pidfd turns readable when its process exits, so one background thread
blocked in ``poll`` on the node's pidfds learns of a death at once, at no cost to the
fast path: waits read one attribute (``PeerWatch.check``) every few hundred polls.
Ranks on other nodes cannot be watched this way; for them the deadline speaks.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .config import seconds_from_env
from .errors import ExchangeTimeout, PeerDied
from .logs import get_logger
from .mpi_segments import remove_mpi_segments, remove_stale_mpi_segments
from .topology import World

__all__ = ["PeerWatch", "process_start_time", "watched_allgather", "watched_barrier",
           "wait_request", "peer_exit_grace", "DEFAULT_EXIT_GRACE_S", "leave_after_peer_death"]

log = get_logger("peers")

# Waits on MPI requests poll MPI_Test and yield the core in between (small collectives
# finish within microseconds and must not pay for a sleep); every _POLLS_PER_CHECK polls
# they ask the watch and the clock, and after _POLLS_BEFORE_SLEEP polls they also sleep.
_POLLS_PER_CHECK = 64
_POLLS_BEFORE_SLEEP = 50_000
_LONG_WAIT_SLEEP_S = 50e-6
# watched_allgather's fixed slot per rank, and the length word at its start.
_SLOT_BYTES = 512
_LENGTH = struct.Struct("=i")
# How long a rank stuck in a call that cannot notice a dead peer lives on after the death.
DEFAULT_EXIT_GRACE_S = 2.0


def peer_exit_grace() -> float:
    """``IPCSHARE_PEER_EXIT_GRACE`` seconds, default 2 (see ``PeerWatch.exit_if_stuck``).

    Raises:
        ConfigError: set but not a positive number.
    """
    return seconds_from_env("IPCSHARE_PEER_EXIT_GRACE", DEFAULT_EXIT_GRACE_S)


def process_start_time(pid: int | str = "self") -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field
    22), or None when it cannot be read. With the pid it names one process for good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rfind(b")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


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
        self._saved_sigusr1 = _survive_failure_notices()
        self._thread: threading.Thread | None = None
        if watched:
            self._thread = threading.Thread(target=self._watch, name="ipcshare-peer-watch",
                                            daemon=True)
            self._thread.start()

    @classmethod
    def open(cls, world: World) -> PeerWatch:
        """Collective over ``world.comm``: open a pidfd on every other rank of the node.

        A peer whose pid does not name the same process here (another PID namespace)
        is left to the deadlines, and so is every rank when pidfds are unavailable.
        """
        start_times = world.comm.allgather(process_start_time())
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

    def describe(self, doing: str = "") -> str:
        world = self.world
        dead = ", ".join(f"{world.where(r)} (pid {world.pids[r]})" for r in self._dead)
        return (f"{dead} died" + (f" while {world.where()} was in {doing}" if doing else ""))

    def fail(self, reason: str) -> None:
        """Mark the group's communicators unusable (a collective was abandoned)."""
        if self.failed is None:
            self.failed = reason

    def exit_if_stuck(self, *, grace: float) -> None:
        """After a peer's death, have this process ended if it has not closed the watch
        within ``grace`` seconds: it is then stuck in a call that cannot notice (a
        blocking MPI collective), and only another process can free it (see
        ``ipcshare.peer_guard``). Idempotent; nothing to do on a node of one rank."""
        if self._guard is not None or not self._pidfds or self._stopped.is_set():
            return
        import json
        import subprocess

        world = self.world
        own = os.pidfd_open(os.getpid())
        try:
            spec = {"pid": os.getpid(), "rank_pidfd": own, "grace": grace, "me": world.where(),
                    "peers": {str(fd): f"{world.where(r)} (pid {world.pids[r]})"
                              for fd, r in self._pidfds.items()}}
            self._guard = subprocess.Popen(
                [sys.executable, "-m", "ipcshare.peer_guard", json.dumps(spec)],
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
        os.close(self._wake_read)
        os.close(self._wake_write)

    def __enter__(self) -> PeerWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _note_failure_notice(_signum: int, _frame: Any) -> None:
    log.debug("the launcher reports that a process of the job failed")


def _survive_failure_notices() -> Any:
    """Keep the launcher's failure notice from killing us; returns the old disposition.

    Hydra's ``mpiexec -disable-auto-cleanup`` tells the survivors of a dead process with
    SIGUSR1, whose default action is to terminate: they would die before they could say
    who died. Only a default disposition is replaced (the application's own handler
    stays), and only from the main thread, where Python allows it.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        if signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
            return None
        return signal.signal(signal.SIGUSR1, _note_failure_notice)
    except (ValueError, OSError):
        return None


def wait_request(request: Any, *, watch: PeerWatch | None, timeout: float, what: str) -> None:
    """Complete a non-blocking MPI request, giving up when a peer dies or time runs out.

    Raises:
        PeerDied: a watched rank exited; the request is abandoned (``watch.failed``).
        ExchangeTimeout: not complete within ``timeout`` seconds (a rank on another node
            died or hangs); the request is abandoned.
    """
    if request.Test():
        return
    deadline = time.monotonic() + timeout
    polls = 0
    try:
        while not request.Test():
            polls += 1
            if polls % _POLLS_PER_CHECK:
                # Ranks may outnumber cores: let the one we wait for run. Costs nothing
                # when every rank has its own core.
                os.sched_yield()
                continue
            if watch is not None:
                watch.check(what)
            if time.monotonic() > deadline:
                raise ExchangeTimeout(
                    f"{what}: not every rank arrived within {timeout:g} s (a rank died or "
                    "hangs; see its own output)")
            if polls > _POLLS_BEFORE_SLEEP:
                time.sleep(_LONG_WAIT_SLEEP_S)  # a long wait: stop burning a shared core
    except Exception as exc:
        if watch is not None:
            watch.fail(str(exc))
            # MPICH may report the loss of a peer as an MPI error: name the peer instead.
            if not isinstance(exc, PeerDied) and watch.dead_ranks:
                raise PeerDied(watch.describe(what)) from exc
        raise


def watched_allgather(comm: Any, value: Any, *, watch: PeerWatch | None, timeout: float,
                      what: str) -> list[Any]:
    """Collective: every rank's picklable ``value``, by rank, like ``comm.allgather``, but
    with a deadline and the watch consulted while waiting.

    Values that pickle to at most ``_SLOT_BYTES - 4`` bytes (statuses, sizes, handles)
    travel in one fixed-size all-gather; larger ones take a second, sized round.

    Raises:
        PeerDied / ExchangeTimeout: as ``wait_request``.
    """
    import pickle

    from .topology import mpi

    MPI = mpi()
    size = comm.Get_size()
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    slot = bytearray(_SLOT_BYTES)
    _LENGTH.pack_into(slot, 0, len(data))
    if len(data) <= _SLOT_BYTES - _LENGTH.size:
        slot[_LENGTH.size:_LENGTH.size + len(data)] = data
    gathered = bytearray(size * _SLOT_BYTES)
    wait_request(comm.Iallgather([slot, MPI.BYTE], [gathered, MPI.BYTE]), watch=watch,
                 timeout=timeout, what=what)
    lengths = [_LENGTH.unpack_from(gathered, r * _SLOT_BYTES)[0] for r in range(size)]
    if max(lengths) <= _SLOT_BYTES - _LENGTH.size:
        return [pickle.loads(gathered[r * _SLOT_BYTES + _LENGTH.size:
                                      r * _SLOT_BYTES + _LENGTH.size + lengths[r]])
                for r in range(size)]
    offsets = [sum(lengths[:r]) for r in range(size)]
    everything = bytearray(sum(lengths))
    wait_request(comm.Iallgatherv([data, MPI.BYTE], [everything, (lengths, offsets), MPI.BYTE]),
                 watch=watch, timeout=timeout, what=what)
    return [pickle.loads(everything[o:o + n]) for o, n in zip(offsets, lengths, strict=True)]


def watched_barrier(comm: Any, *, watch: PeerWatch | None, timeout: float, what: str) -> None:
    """Collective: ``comm.Barrier()`` with a deadline and the watch consulted.

    Raises:
        PeerDied / ExchangeTimeout: as ``wait_request``.
    """
    wait_request(comm.Ibarrier(), watch=watch, timeout=timeout, what=what)


def leave_after_peer_death(status: int, *, linger: float) -> None:
    """Flush, pause ``linger`` seconds and end the process without MPI_Finalize (which
    could wait forever for the dead rank).

    Launchers end the whole job when the next process exits (hydra even with
    -disable-auto-cleanup, gforker with SIGQUIT), which would cut off the reports of the
    other survivors: those waiting in ipcshare find out within milliseconds, those stuck
    in a blocking MPI call are ended by their guard after the grace period. Pass the
    grace plus a margin, so that every survivor has spoken before the first one leaves.
    No MPI_Abort either, for the same reason.
    """
    remove_mpi_segments()
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(linger)
    os._exit(status)
