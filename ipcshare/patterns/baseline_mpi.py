"""The MPI baseline: mpi4py Allgather / Sendrecv on host numpy buffers, same sizes, same
seeded data, same checks, timed the same way as ours."""

from __future__ import annotations

import time

import numpy as np

from ..topology import World, mpi
from .base import SizePlan
from .seeding import count_wrong, poison, seeded_bytes

__all__ = ["MpiBaseline"]


class MpiBaseline:
    """Times the MPI equivalent of a pattern on one size."""

    name = "mpi"

    def __init__(self, world: World, op: str) -> None:
        self.world = world
        self.op = op
        self.version = mpi().Get_library_version().splitlines()[0].strip()
        self.version = " ".join(self.version.split())

    def measure(self, plan: SizePlan, mode: str, *, iters: int, warmup: int,
                checks: int) -> tuple[float, int]:
        """(seconds per operation averaged over ranks, wrong elements summed over ranks)."""
        comm, n, me = self.world.comm, self.world.size, self.world.rank
        block = plan.block_bytes
        recv = np.empty(block * n, dtype=np.uint8)
        send = np.empty(block, dtype=np.uint8)
        operation = self._operation(send, recv, block, mode)
        wrong = 0
        for iteration in range(checks):
            recv[:] = poison(recv.nbytes)
            data = seeded_bytes(iteration, me, block)
            if mode == "in-place" or self.op == "ring":
                recv[me * block:(me + 1) * block] = data
            else:
                send[:] = data
            operation()
            for rank in range(n):
                wrong += count_wrong(recv[rank * block:(rank + 1) * block],
                                     seeded_bytes(iteration, rank, block), plan.element_size)
        for _ in range(warmup):
            operation()
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            operation()
        seconds = (time.perf_counter() - start) / iters
        MPI = mpi()
        return comm.allreduce(seconds, op=MPI.SUM) / n, comm.allreduce(wrong, op=MPI.SUM)

    def _operation(self, send: np.ndarray, recv: np.ndarray, block: int, mode: str):
        MPI = mpi()
        comm, n, me = self.world.comm, self.world.size, self.world.rank
        if self.op == "allgather":
            if mode == "in-place":
                return lambda: comm.Allgather(MPI.IN_PLACE, [recv, MPI.BYTE])
            return lambda: comm.Allgather([send, MPI.BYTE], [recv, MPI.BYTE])
        nxt, prev = (me + 1) % n, (me - 1) % n
        views = [recv[r * block:(r + 1) * block] for r in range(n)]

        def ring() -> None:
            if n == 1:
                views[0][:] = views[0]
                return
            for step in range(n - 1):
                out, into = (me - step) % n, (me - step - 1) % n
                comm.Sendrecv([views[out], MPI.BYTE], dest=nxt, sendtag=step,
                              recvbuf=[views[into], MPI.BYTE], source=prev, recvtag=step)
        return ring
