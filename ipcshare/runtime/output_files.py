"""Output files a command will write (``--json``, ``--yaml``, ``--markdown``): refused
before any work when they cannot be written, so a long run does not end in an error."""

from __future__ import annotations

import os

from .errors import ConfigError

__all__ = ["check_writable"]


def check_writable(path: str | None) -> None:
    """Fail early (before any work) when ``path`` cannot be written.

    Raises:
        ConfigError: its directory is missing or not writable, or it is a directory.
    """
    if not path:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"cannot write {path!r}: it is a directory")
    if not os.path.isdir(directory):
        raise ConfigError(f"cannot write {path!r}: no directory {directory!r}")
    if not os.access(directory, os.W_OK):
        raise ConfigError(f"cannot write {path!r}: directory {directory!r} is not writable")
