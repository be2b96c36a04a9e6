"""Rank-prefixed logging: every line says which rank on which host wrote it."""

from __future__ import annotations

import logging
import socket
import sys

from . import settings

__all__ = ["get_logger", "configure_logging"]

_LOGGER_NAME = "ipcshare"


def get_logger(name: str | None = None) -> logging.Logger:
    """The package logger, or a child of it (``ipcshare.<name>``)."""
    return logging.getLogger(_LOGGER_NAME if not name else f"{_LOGGER_NAME}.{name}")


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_WARNED: set[str] = set()


def configure_logging(rank: int, *, level: str | None = None) -> None:
    """Send ipcshare logs to stderr as ``[ipcshare rank 1@host] LEVEL message``.

    The level comes from ``level`` or ``IPCSHARE_LOG`` (default WARNING). Calling it
    again only updates the rank and level, so it is safe in tests that open many groups.
    """
    logger = logging.getLogger(_LOGGER_NAME)
    given = level or settings.log_level() or "WARNING"
    wanted = given.upper()
    if wanted not in _LEVELS:
        # Warned, not raised: ranks configure logging before their first collective, so
        # a rank raising alone here would leave the others waiting in it.
        if given not in _WARNED:
            _WARNED.add(given)
            source = "level" if level else settings.LOG
            sys.stderr.write(f"ipcshare: warning: {source}={given!r} is not a log "
                             f"level ({', '.join(_LEVELS)}): using WARNING\n")
        wanted = "WARNING"
    logger.setLevel(getattr(logging, wanted))
    prefix = f"[ipcshare rank {rank}@{socket.gethostname()}]"
    formatter = logging.Formatter(f"{prefix} %(levelname)s %(message)s")
    for handler in logger.handlers:
        if getattr(handler, "_ipcshare", False):
            handler.setFormatter(formatter)
            return
    handler = logging.StreamHandler()
    handler._ipcshare = True  # type: ignore[attr-defined]
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.propagate = False
