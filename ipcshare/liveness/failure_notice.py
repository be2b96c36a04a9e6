"""The launchers' failure notices, survived so that survivors can say who died: hydra's
SIGUSR1, and gforker's SIGINT when it follows a peer's death."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from ..runtime.logs import get_logger

__all__ = ["survive_failure_notices", "survive_interrupt_after_death", "note_continuation"]

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


def survive_interrupt_after_death(peer_died: Callable[[], bool]) -> Any:
    """Take a SIGINT that follows a watched peer's death for the launcher's failure
    notice, not for Ctrl-C; returns the old handler (None when nothing was replaced).

    ``mpiexec.gforker`` interrupts every survivor when a rank dies (and sends SIGQUIT
    about a second later): with Python's default handler the survivors left by
    KeyboardInterrupt, printing nothing, before their waits could name the dead rank
    (4 of 6 trials with ``ipcshare ring``). When ``peer_died()`` says a peer is gone, the
    interrupt is let pass: the rank's own wait raises PeerDied within milliseconds and
    says who died. Any other SIGINT is a KeyboardInterrupt as before. Only Python's
    default handler is replaced, and only from the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupted(signum: int, frame: Any) -> None:
        if peer_died():
            log.debug("interrupted after a peer died: the launcher's failure notice")
            return
        signal.default_int_handler(signum, frame)

    try:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return None
        signal.signal(signal.SIGINT, interrupted)
        return signal.default_int_handler
    except (ValueError, OSError):
        return None


def note_continuation(continued: Callable[[], None]) -> Any:
    """Call ``continued()`` when this process is continued after a stop (SIGCONT): its
    peers may have given up on it meanwhile, and its own message must say so rather than
    blame them. Returns the old disposition (None when nothing was replaced: only the
    default one is, and only from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_continue(_signum: int, _frame: Any) -> None:
        continued()

    try:
        if signal.getsignal(signal.SIGCONT) is not signal.SIG_DFL:
            return None
        return signal.signal(signal.SIGCONT, on_continue)
    except (ValueError, OSError):
        return None
