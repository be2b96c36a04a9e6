"""What ``/proc`` says of a process that another one cannot ask: when it started, whether
it is stopped, and whether it has said why it leaves. Light on purpose (the guard process
imports it): nothing but the standard library."""

from __future__ import annotations

__all__ = ["process_start_time", "process_is_stopped", "peer_state", "mark_leaving",
           "LEAVING_NAME"]

# The name a rank takes once it has written its last line and only waits to leave
# (``exit_policy.leave_after_peer_death``): its node peers read it in /proc/PID/comm, the
# one thing of a process that every other process of the user may read and that it may
# set for itself, with no file or socket to leave behind (15 bytes at most).
LEAVING_NAME = "ipcshare-leave"


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` from the third (the state) on, or None where it
    cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rfind(b")") + 2:].split()


def process_start_time(pid: int | str = "self") -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field
    22), or None when it cannot be read. With the pid it names one process for good."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def process_is_stopped(pid: int | str) -> bool:
    """Whether process ``pid`` is stopped (``/proc/PID/stat`` state T: SIGSTOP, SIGTSTP,
    or t: a debugger's stop): alive, but it answers nothing until continued."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in (b"T", b"t")


def peer_state(pid: int, start_time: int | None) -> str:
    """What became of the process that ``pid`` named when it started at ``start_time``
    (``process_start_time``): ``gone`` (exited, a zombie, another process by now, or not
    visible here), ``stopped``, ``leaving`` (it said its last line and only waits to
    leave: ``mark_leaving``) or ``running``."""
    fields = _stat_fields(pid)
    if not fields or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return "gone"
    if start_time is None or fields[19] != str(start_time).encode():
        return "gone"
    if fields[0] in (b"T", b"t"):
        return "stopped"
    try:
        with open(f"/proc/{pid}/comm", "rb") as comm:
            name = comm.read().strip()
    except OSError:
        return "gone"
    return "leaving" if name == LEAVING_NAME.encode() else "running"


def mark_leaving() -> bool:
    """Name this process ``LEAVING_NAME``, so that its node peers see it has spoken and
    need not wait for it; False where that cannot be done (no /proc)."""
    try:
        with open("/proc/self/comm", "wb") as comm:
            comm.write(LEAVING_NAME.encode())
        return True
    except OSError:
        return False
