"""How a rank leaves after a peer died or stopped answering: the grace a stuck rank gets
before its guard ends it, and the exit without MPI_Finalize that cleans up MPI's shared
memory first, once the other ranks have had their say."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time

from ..runtime import settings
from ..topology import job_ranks
from ..topology.process_state import mark_leaving, peer_state
from .mpi_segments import remove_mpi_segments

__all__ = ["peer_exit_grace", "DEFAULT_EXIT_GRACE_S", "leave_after_peer_death",
           "leave_without_finalize_at_exit", "leaving_without_finalize",
           "stopped_peers_to_wake", "peers_have_spoken"]

# How long a rank stuck in a call that cannot notice a dead peer lives on after the death.
DEFAULT_EXIT_GRACE_S = 2.0
# How often a leaving rank looks whether its node peers have spoken.
_PEER_LOOK_S = 0.02


def peer_exit_grace() -> float:
    """``IPCSHARE_PEER_EXIT_GRACE`` seconds, default 2 (see ``PeerWatch.exit_if_stuck``).

    Raises:
        ConfigError: set but not a positive number.
    """
    return settings.seconds(settings.PEER_EXIT_GRACE, DEFAULT_EXIT_GRACE_S)


def leave_after_peer_death(status: int, *, linger: float, wake: list[int] = ()) -> None:
    """Flush, wait until every other rank has spoken (``linger`` seconds at most) and end
    the process without MPI_Finalize (which could wait forever for the dead rank).

    Launchers end the whole job when the next process exits (hydra even with
    -disable-auto-cleanup, gforker with SIGQUIT), which would cut off the reports of the
    other survivors: those waiting in ipcshare find out within milliseconds, those stuck
    in a blocking MPI call are ended by their guard after the grace period, those waiting
    in a collective time out within the exchange timeout. So this rank marks itself as
    leaving (``topology.process_state.mark_leaving``) and waits until each rank of the job is gone,
    stopped or leaving too (``peers_have_spoken``); where it cannot see them all (ranks on
    other nodes or in other PID namespaces), it waits ``linger``: pass the longest a peer
    may take to speak (the grace, or the exchange timeout) plus a margin.
    ``wake``: pidfds of stopped peers to continue on the way out.
    No MPI_Abort either, for the same reason. The launcher's notices meanwhile (gforker
    interrupts every survivor when a process leaves) are ignored: they would otherwise end
    the pause with a KeyboardInterrupt traceback instead of this exit.
    """
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    remove_mpi_segments()
    sys.stdout.flush()
    sys.stderr.flush()
    if linger > 0:
        mark_leaving()
        ends = time.monotonic() + linger
        while not peers_have_spoken() and time.monotonic() < ends:
            time.sleep(min(_PEER_LOOK_S, max(0.0, ends - time.monotonic())))
    for pidfd in wake:  # stopped peers (pidfds): continued, each ends by itself
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGCONT)
    os._exit(status)


def peers_have_spoken() -> bool:
    """Whether every other rank of the job is seen here (``topology.job_ranks``) and each
    is gone, stopped, or leaving (it wrote its last line): nobody's line is lost when this
    process leaves. False while some rank runs on, or is out of sight (another node,
    another PID namespace)."""
    return job_ranks.every_rank_seen() and all(
        peer_state(seen.pid, seen.start_time) != "running"
        for seen in job_ranks.seen_ranks().values())


_leaving_because: str | None = None
_to_wake: list[int] = []  # pidfds of stopped peers


def leave_without_finalize_at_exit(reason: str, *, stopped_pids: list[int] = ()) -> None:
    """Have this process end without MPI_Finalize when Python exits (a peer that is
    stopped or dead cannot answer it, and MPICH's would wait for it for ever): flushed,
    once the peers have spoken (the exchange timeout and a margin at most:
    ``leave_after_peer_death``), with status 1 (the job failed: ``reason``). Idempotent.
    The CLI leaves by itself (cli/main.py); this is for programs that use the library and
    end on the error that named the peer.

    ``stopped_pids``: node peers that are stopped. They are continued (SIGCONT) as this
    process leaves: nobody else would end them, and their launcher would wait for them
    for ever; continued, each finds its peers gone, says so and leaves the same way.
    """
    global _leaving_because
    if _leaving_because is None:
        atexit.register(_leave_at_exit)
    _leaving_because = reason
    for pid in stopped_pids:
        if _guarded(pid):
            continue  # its guard ends it, with a line of its own, when we leave
        with contextlib.suppress(OSError, AttributeError):
            _to_wake.append(os.pidfd_open(pid))  # no pid reuse can redirect the wake-up


def leaving_without_finalize() -> bool:
    """Whether this process must leave without MPI_Finalize (a peer is dead or stopped:
    ``leave_without_finalize_at_exit`` was called)."""
    return _leaving_because is not None


def stopped_peers_to_wake() -> list[int]:
    """Pidfds of the stopped peers that nobody else will end (no guard of their own):
    ``leave_after_peer_death`` continues them on the way out (cli/main.py)."""
    return list(_to_wake)


def _guarded(pid: int) -> bool:
    """Whether process ``pid`` has a peer guard among its children (``PeerWatch.exit_if_stuck``),
    which ends it when a peer leaves; False where that cannot be read."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            children = listing.read().split()
    except OSError:
        return False
    for child in children:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                if b"ipcshare.exchange.peer_guard" in cmdline.read():
                    return True
        except OSError:
            continue
    return False


def _leave_at_exit() -> None:
    MPI = sys.modules.get("mpi4py.MPI")
    if (MPI is None or not MPI.Is_initialized() or MPI.Is_finalized()
            or MPI.COMM_WORLD.Get_size() == 1):
        return  # no MPI_Finalize to wait in with a peer (a process alone, or no MPI)
    try:
        linger = settings.exchange_timeout()
    except Exception:  # a bad value was refused by name already; not a traceback now
        linger = settings.DEFAULT_EXCHANGE_TIMEOUT_S
    leave_after_peer_death(1, linger=min(linger, 30.0) + 0.5, wake=_to_wake)
