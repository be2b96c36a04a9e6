"""The exit statuses of the ``ipcshare`` commands (usable in cluster CI)."""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_WRONG", "EXIT_SLOW", "EXIT_MEASUREMENT",
           "EXIT_READER_GONE"]

EXIT_OK = 0
EXIT_ERROR = 1      # an error on some rank (config, backend, exchange...)
EXIT_USAGE = 2      # the command line itself is malformed
EXIT_WRONG = 3      # data verification found mismatches
EXIT_SLOW = 4       # bandwidth under --min-bw
EXIT_MEASUREMENT = 5   # a timed row failed its self-checks (clocks disagree, above the ceiling)
EXIT_READER_GONE = 141   # stdout's reader went away (``| head``): 128 + SIGPIPE, as a shell tool
