"""A progress line on a terminal, rewritten in place with a carriage return."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["ProgressLine"]


class ProgressLine:
    """One status line on ``stream``, shown only when it is a terminal and only once the
    run has lasted ``delay_s`` (short runs stay quiet). ``clear()`` before printing
    anything else to the same terminal."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None,
                 delay_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._clock = clock
        self._started = clock()
        self._delay_s = delay_s
        self._width = 0

    @property
    def elapsed_s(self) -> float:
        """Seconds since the line was created."""
        return self._clock() - self._started

    def show(self, text: str) -> None:
        """Replace the line with ``text`` (nothing when disabled or still early)."""
        if not self.enabled or self.elapsed_s < self._delay_s:
            return
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Blank the line, leaving the cursor at its start."""
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
