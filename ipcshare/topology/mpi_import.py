"""mpi4py's ``MPI`` module, imported on first use (that is when MPI_Init runs), never at
ipcshare import."""

from __future__ import annotations

from typing import Any

__all__ = ["mpi"]


def mpi() -> Any:
    """Import and return ``mpi4py.MPI`` (initialises MPI on first use)."""
    from mpi4py import MPI  # heavy: MPI_Init happens here, never at ipcshare import

    return MPI
