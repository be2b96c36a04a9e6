"""The old home of MPI shared-memory cleanup, kept because tests name it: see
``ipcshare.liveness.mpi_segments``."""

from .liveness.mpi_segments import SHM_DIR, remove_mpi_segments, remove_stale_mpi_segments

__all__ = ["SHM_DIR", "remove_mpi_segments", "remove_stale_mpi_segments"]
