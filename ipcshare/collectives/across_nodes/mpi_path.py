"""Window bytes through MPI, for the hops between nodes: straight from host memory, from
device memory when the MPI is CUDA-aware, and through host copies otherwise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...runtime import settings
from ...topology.world import mpi

__all__ = ["MpiPath", "mpi_cuda_aware", "mpi_path_mode", "MPI_CUDA_AWARE_ENV",
           "MPI_PATH_MODES"]

# "1" / "0" overrides the probe: a GPU node can then time both device paths.
MPI_CUDA_AWARE_ENV = settings.MPI_CUDA_AWARE
# host: host memory as it is; cuda-aware: device pointers to MPI; host-staged: copies.
MPI_PATH_MODES = ("host", "cuda-aware", "host-staged")


def mpi_cuda_aware() -> bool:
    """Whether MPI may be handed device pointers: ``IPCSHARE_MPI_CUDA_AWARE`` when set,
    else the MPI's own answer (``MPIX_Query_cuda_support``, where mpi4py offers it).

    Raises:
        ConfigError: the variable is set to something other than 0 or 1.
    """
    override = settings.mpi_cuda_aware()
    if override is not None:
        return override
    query = getattr(mpi(), "Query_cuda_support", None)
    return bool(query()) if query is not None else False


def mpi_path_mode(device_memory: bool) -> str:
    """Which of ``MPI_PATH_MODES`` carries a backend's memory (``device_memory``: the
    backend's declaration that its memory lives on a GPU)."""
    if not device_memory:
        return "host"
    return "cuda-aware" if mpi_cuda_aware() else "host-staged"


class MpiPath:
    """How one window's bytes reach MPI. ``mode`` is one of ``MPI_PATH_MODES``.

    Device memory is only read or written after the engine synchronised, so MPI never
    races the stream: the caller synchronises before handing a buffer over.
    """

    def __init__(self, engine: Any, device_memory: bool) -> None:
        self.engine = engine
        self.mode = mpi_path_mode(device_memory)

    def sendable(self, buffer: Any) -> Any:
        """An object MPI can send ``buffer``'s bytes from (a host copy when staged)."""
        if self.mode == "host":
            return np.asarray(buffer)
        if self.mode == "cuda-aware":
            return buffer
        return self.engine.download(buffer)

    def receiver(self, buffer: Any) -> tuple[Any, Callable[[], None]]:
        """(an object MPI can receive ``buffer.nbytes`` bytes into, a callable that puts
        them in ``buffer`` once received: a no-op unless staged). The staging array is
        made once, here, and reused by every call of the callable."""
        if self.mode == "host":
            return np.asarray(buffer), _nothing
        if self.mode == "cuda-aware":
            return buffer, _nothing
        staging = np.empty(buffer.nbytes, dtype=np.uint8)
        engine = self.engine
        return staging, lambda: engine.upload(buffer, staging)

    def allgatherv_in_place(self, comm: Any, output: Any, counts: list[int],
                            displacements: list[int], *,
                            wait: Callable[[Any], None] | None = None) -> Callable[[], None]:
        """A callable running ``Allgatherv(IN_PLACE)`` over ``comm`` on the bytes of
        ``output``: this rank's segment (``counts`` / ``displacements`` at its rank in
        ``comm``) goes to every other rank, theirs land at their displacements.

        With ``wait`` (a wait with a deadline) the collective is non-blocking, and goes
        through a host buffer of its own: a request given up on may still complete when
        a late peer comes, so MPI must never hold the window's memory, which is unmapped
        at close. Device pointers (CUDA-aware MPI) keep the blocking call, deadline-free:
        some MPIs (Open MPI 4) take device pointers in blocking collectives only."""
        MPI = mpi()
        if self.mode == "cuda-aware" or (self.mode == "host" and wait is None):
            target, _ = self.receiver(output)
            spec = [target, counts, displacements, MPI.BYTE]
            return lambda: comm.Allgatherv(MPI.IN_PLACE, spec)
        staging = np.empty(output.nbytes, dtype=np.uint8)
        spec = [staging, counts, displacements, MPI.BYTE]
        me = comm.Get_rank()
        own = (displacements[me], counts[me])
        own_source = output.slice(*own)
        others = [(output.slice(d, c), staging[d:d + c])
                  for r, (c, d) in enumerate(zip(counts, displacements, strict=True))
                  if r != me and c]
        if self.mode == "host":
            def download(buffer: Any) -> np.ndarray:
                return np.asarray(buffer).view(np.uint8).reshape(-1)

            def upload(buffer: Any, data: np.ndarray) -> None:
                np.asarray(buffer).view(np.uint8).reshape(-1)[:] = data
        else:
            download, upload = self.engine.download, self.engine.upload

        def staged() -> None:
            staging[own[0]:own[0] + own[1]] = download(own_source)
            if wait is None:
                comm.Allgatherv(MPI.IN_PLACE, spec)
            else:
                wait(comm.Iallgatherv(MPI.IN_PLACE, spec))
            for destination, data in others:
                upload(destination, data)
        return staged


def _nothing() -> None:
    return None
