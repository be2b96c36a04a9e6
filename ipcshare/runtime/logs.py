"""Rank-prefixed logging: every line says which rank on which host wrote it."""

from __future__ import annotations

import logging
import socket

from . import settings

__all__ = ["get_logger", "configure_logging"]

_LOGGER_NAME = "ipcshare"


def get_logger(name: str | None = None) -> logging.Logger:
    """The package logger, or a child of it (``ipcshare.<name>``)."""
    return logging.getLogger(_LOGGER_NAME if not name else f"{_LOGGER_NAME}.{name}")


def configure_logging(rank: int, *, level: str | None = None) -> None:
    """Send ipcshare logs to stderr as ``[ipcshare rank 1@host] LEVEL message``.

    The level comes from ``level`` or ``IPCSHARE_LOG`` (default WARNING). Calling it
    again only updates the rank and level, so it is safe in tests that open many groups.
    """
    logger = logging.getLogger(_LOGGER_NAME)
    wanted = (level or settings.log_level() or "WARNING").upper()
    logger.setLevel(getattr(logging, wanted, logging.WARNING))
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
