"""What the CLI does when whoever reads its standard output goes away (``ipcshare ... |
head -3``): never an "internal error", never a rank left waiting.

A process alone in its world stops at once, as a shell tool killed by SIGPIPE does: the
``BrokenPipeError`` unwinds through the with-blocks that close what the command opened, and
the command exits with ``EXIT_READER_GONE``. A rank of a larger job cannot stop alone (its
peers wait for it in the next collective), so it goes on with its output sent to
``/dev/null`` and reports the lost reader in its exit status when the job is done.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

__all__ = ["StdoutGuard"]


class StdoutGuard:
    """Stands in for ``sys.stdout`` while a command runs (``install`` / ``uninstall``);
    ``reader_gone`` says whether a write found the pipe closed."""

    def __init__(self, stream: TextIO, *, alone: bool) -> None:
        self._stream = stream
        self._alone = alone
        self.reader_gone = False

    @classmethod
    def install(cls, *, alone: bool) -> StdoutGuard:
        guard = cls(sys.stdout, alone=alone)
        sys.stdout = guard  # type: ignore[assignment]
        return guard

    def uninstall(self) -> None:
        if sys.stdout is self:
            sys.stdout = self._stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._lost()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._lost()

    def _lost(self) -> None:
        """The reader left: from now on every byte goes to /dev/null (also the ones still
        buffered, so that the interpreter's last flush cannot fail again). Alone in its
        world the process stops here; a rank of a job goes on with its peers."""
        first = not self.reader_gone
        self.reader_gone = True
        if first:
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(devnull, self._stream.fileno())
                finally:
                    os.close(devnull)
            except (OSError, ValueError):
                pass
        if self._alone:
            raise BrokenPipeError(32, "the reader of standard output left")

    def __getattr__(self, name: str) -> Any:
        # fileno, isatty, encoding, buffer...: the real stream's
        return getattr(self._stream, name)
