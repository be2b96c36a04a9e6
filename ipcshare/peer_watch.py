"""The old home of the peer watch and its waits, kept because tests and docs name it:
everything lives in ``ipcshare.liveness`` now."""

from .liveness.deadline_waits import wait_request, watched_allgather, watched_barrier
from .liveness.exit_policy import DEFAULT_EXIT_GRACE_S, leave_after_peer_death, peer_exit_grace
from .liveness.pidfd_watch import PeerWatch, process_start_time

__all__ = ["PeerWatch", "process_start_time", "watched_allgather", "watched_barrier",
           "wait_request", "peer_exit_grace", "DEFAULT_EXIT_GRACE_S", "leave_after_peer_death"]
