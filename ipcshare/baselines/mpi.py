"""The MPI baseline: mpi4py Allgather / Sendrecv on host numpy buffers, same sizes, same
seeded data, same checks, timed the same way as ours."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..patterns.base import SizePlan
from ..patterns.rotation import warmup_iterations
from ..patterns.seeding import count_wrong, poison, seeded_bytes
from ..patterns.timing import slowest_rank_samples
from ..runtime.errors import ConfigError
from ..topology.world import World, mpi, mpi_library_name

__all__ = ["MpiBaseline"]


class MpiBaseline:
    """Times the MPI equivalent of a pattern on one size."""

    name = "mpi"
    label = "MPI through mpi4py"
    path_column = False
    # One path, timed by the host clock alone: no wrong paths set aside, no second clock
    # to hold it against and so nothing timed again (the GPU baselines' ``wrong_paths``,
    # ``clock`` and ``clock_rechecks``).
    wrong_paths: dict[str, int] = {}
    clock: tuple[str | None, float | None] | None = None
    clock_rechecks = 0

    def __init__(self, world: World, op: str) -> None:
        """Raises:
            ConfigError: an op other than allgather and ring (``baselines.mpi_baseline`` picks the
                reduction baseline for the others).
        """
        if op not in ("allgather", "ring"):
            raise ConfigError(f"the MPI all-gather / ring baseline cannot time {op}: "
                              "mpi_baseline(world, pattern) picks the baseline of each op")
        self.world = world
        self.op = op
        self.version = mpi_library_name()
        self.version = " ".join(self.version.split())

    def measure(self, plan: SizePlan, mode: str, *, iters: int, warmup: int, checks: int,
                buffers: int = 1) -> tuple[float, int]:
        """Collective, nccl-tests timing: (seconds per operation averaged over ranks,
        wrong elements summed over ranks). ``buffers`` > 1 cycles the operations over
        that many disjoint send/receive buffer pairs."""
        comm, n = self.world.comm, self.world.size
        operations, wrong = self._checked_operations(plan, mode, checks, buffers)
        for iteration in range(warmup_iterations(warmup, buffers)):
            operations[iteration % buffers]()
        sequence = [operations[i % buffers] for i in range(iters)]
        comm.Barrier()
        start = time.perf_counter()
        for operation in sequence:
            operation()
        seconds = (time.perf_counter() - start) / iters
        return comm.allreduce(seconds, op=mpi().SUM) / n, wrong

    def measure_latency(self, plan: SizePlan, mode: str, *, iters: int, warmup: int,
                        checks: int, buffers: int = 1) -> tuple[list[float], int]:
        """Collective, latency timing: (seconds of each of ``iters`` samples of one
        operation, each the slowest rank's; wrong elements summed over ranks)."""
        comm = self.world.comm
        operations, wrong = self._checked_operations(plan, mode, checks, buffers)
        for iteration in range(warmup_iterations(warmup, buffers)):
            operations[iteration % buffers]()
        samples = []
        for iteration in range(iters):
            operation = operations[iteration % buffers]
            comm.Barrier()
            start = time.perf_counter()
            operation()
            samples.append(time.perf_counter() - start)
        return slowest_rank_samples(comm, samples), wrong

    def _checked_operations(self, plan: SizePlan, mode: str, checks: int,
                            buffers: int) -> tuple[list[Callable[[], None]], int]:
        """One operation per buffer pair, and the wrong elements of ``checks`` verified
        runs (iteration i on pair i mod ``buffers``), summed over ranks."""
        n, me = self.world.size, self.world.rank
        block = plan.block_bytes
        pairs = [(np.empty(block, dtype=np.uint8), np.empty(block * n, dtype=np.uint8))
                 for _ in range(buffers)]
        operations = [self._operation(send, recv, block, mode) for send, recv in pairs]
        wrong = 0
        for iteration in range(checks):
            send, recv = pairs[iteration % buffers]
            recv[:] = poison(recv.nbytes)
            data = seeded_bytes(iteration, me, block)
            if mode == "in-place" or self.op == "ring":
                recv[me * block:(me + 1) * block] = data
            else:
                send[:] = data
            operations[iteration % buffers]()
            for rank in range(n):
                wrong += count_wrong(recv[rank * block:(rank + 1) * block],
                                     seeded_bytes(iteration, rank, block), plan.element_size)
        return operations, self.world.comm.allreduce(wrong, op=mpi().SUM)

    def _operation(self, send: np.ndarray, recv: np.ndarray, block: int,
                   mode: str) -> Callable[[], None]:
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
