"""What ``/proc`` says of a process that another one cannot ask: whether it is stopped.
Light on purpose (the guard process imports it): nothing but the standard library."""

from __future__ import annotations

__all__ = ["process_is_stopped"]


def process_is_stopped(pid: int | str) -> bool:
    """Whether process ``pid`` is stopped (``/proc/PID/stat`` state T: SIGSTOP, SIGTSTP,
    or t: a debugger's stop): alive, but it answers nothing until continued."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return False
    # The command name (field 2) may hold spaces and parentheses: the state follows the last ')'.
    return text[text.rfind(b")") + 2:][:1] in (b"T", b"t")
