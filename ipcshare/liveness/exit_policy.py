"""How a rank leaves after a peer died: the grace a stuck rank gets before its guard ends
it, and the exit without MPI_Finalize that cleans up MPI's shared memory first."""

from __future__ import annotations

import os
import sys
import time

from ..runtime import settings
from .mpi_segments import remove_mpi_segments

__all__ = ["peer_exit_grace", "DEFAULT_EXIT_GRACE_S", "leave_after_peer_death"]

# How long a rank stuck in a call that cannot notice a dead peer lives on after the death.
DEFAULT_EXIT_GRACE_S = 2.0


def peer_exit_grace() -> float:
    """``IPCSHARE_PEER_EXIT_GRACE`` seconds, default 2 (see ``PeerWatch.exit_if_stuck``).

    Raises:
        ConfigError: set but not a positive number.
    """
    return settings.seconds(settings.PEER_EXIT_GRACE, DEFAULT_EXIT_GRACE_S)


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
