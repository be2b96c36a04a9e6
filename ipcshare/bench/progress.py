"""A progress line on stderr, rewritten in place with a carriage return."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["ProgressLine"]


class ProgressLine:
    """One status line on ``stream`` (default stderr), shown once the run has lasted
    ``delay_s`` (short runs stay quiet) and rewritten at most every ``interval_s``.

    MPI launchers hand ranks pipes, not terminals, so the line does not wait for a
    terminal; a log gets one carriage-return-separated line per update. ``clear()``
    before printing anything else to the same terminal.
    """

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True,
                 delay_s: float = 2.0, interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self._clock = clock
        self._started = clock()
        self._delay_s = delay_s
        self._interval_s = interval_s
        self._shown_at: float | None = None
        self._width = 0

    @property
    def elapsed_s(self) -> float:
        """Seconds since the line was created."""
        return self._clock() - self._started

    def show(self, text: str) -> None:
        """Replace the line with ``text`` (nothing when disabled, early, or too soon
        after the last update)."""
        now = self._clock()
        if not self.enabled or now - self._started < self._delay_s:
            return
        if self._shown_at is not None and now - self._shown_at < self._interval_s:
            return
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._shown_at = now
        self._width = len(text)

    def clear(self) -> None:
        """Blank the line, leaving the cursor at its start."""
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
