"""ipcshare: share GPU (or host) memory between MPI ranks, map every peer's buffer, and
run verified ring and all-gather patterns on it.

Importing the package is cheap: MPI and CUDA start only when a Group is created.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Group", "Window", "Communicator", "__version__", "errors"]


def __getattr__(name: str):
    if name in ("Group", "Window"):
        from . import window

        return getattr(window, name)
    if name == "Communicator":
        from .collectives import Communicator

        return Communicator
    if name == "errors":
        from . import errors

        return errors
    raise AttributeError(f"module 'ipcshare' has no attribute {name!r}")
