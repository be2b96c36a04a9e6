"""The launcher's failure notice (SIGUSR1): survived, so that survivors can say who died."""

from __future__ import annotations

import signal
import threading
from typing import Any

from ..runtime.logs import get_logger

__all__ = ["survive_failure_notices"]

log = get_logger("peers")


def _note_failure_notice(_signum: int, _frame: Any) -> None:
    log.debug("the launcher reports that a process of the job failed")


def survive_failure_notices() -> Any:
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
