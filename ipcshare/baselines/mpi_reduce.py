"""The MPI baseline of the all-reduce and reduce-scatter cases: mpi4py Allreduce and
Reduce_scatter_block on host numpy buffers, the case's seeded data and checks, timed
as the MPI all-gather baseline is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..patterns.base import SizePlan
from ..patterns.seeding import count_wrong, poison
from ..runtime.errors import ConfigError
from ..topology.world import World, mpi
from .mpi import MpiBaseline

__all__ = ["MpiReductionBaseline"]

# MPI has no 16-bit float types to reduce.
_MPI_TYPES = {"float32": "FLOAT", "int32": "INT32_T"}
_MPI_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


class MpiReductionBaseline(MpiBaseline):
    """Times MPI's all-reduce or reduce-scatter on ``case``'s sizes and data. In place,
    as MPI means it: all-reduce reduces the receive buffer into itself; reduce-scatter
    reads the whole input from the receive buffer and leaves this rank's block at its
    start."""

    def __init__(self, world: World, case: Any) -> None:
        """Raises:
            ConfigError: a datatype MPI cannot reduce (float16, bfloat16).
        """
        if case.datatype not in _MPI_TYPES:
            raise ConfigError(f"--baseline mpi reduces {' and '.join(_MPI_TYPES)} (MPI has no "
                              f"16-bit float types), not -d {case.datatype}: use one of them "
                              "or --baseline none")
        super().__init__(world, "allgather")
        self.op = case.name
        self.case = case

    def _checked_operations(self, plan: SizePlan, mode: str, checks: int,
                            buffers: int) -> tuple[list[Callable[[], None]], int]:
        n, me, case = self.world.size, self.world.rank, self.case
        out_bytes = case.output_bytes(plan, n)
        receive_bytes = plan.size if mode == "in-place" else out_bytes
        pairs = [(np.empty(plan.size, np.uint8), np.empty(receive_bytes, np.uint8))
                 for _ in range(buffers)]
        operations = [self._reduction(send, receive, mode) for send, receive in pairs]
        wrong = 0
        for iteration in range(checks):
            send, receive = pairs[iteration % buffers]
            data = case.input_bytes(plan, me, n, iteration)
            if mode == "in-place":
                receive[:] = data
            else:
                receive[:] = poison(receive.nbytes)
                send[:] = data
            operations[iteration % buffers]()
            wrong += count_wrong(receive[:out_bytes], case.expected_bytes(plan, me, n, iteration),
                                 plan.element_size)
        return operations, self.world.comm.allreduce(wrong, op=mpi().SUM)

    def _reduction(self, send: np.ndarray, receive: np.ndarray,
                   mode: str) -> Callable[[], None]:
        MPI = mpi()
        comm = self.world.comm
        kind = getattr(MPI, _MPI_TYPES[self.case.datatype])
        op = getattr(MPI, _MPI_OPS[self.case.op])
        if self.op == "allreduce":
            if mode == "in-place":
                return lambda: comm.Allreduce(MPI.IN_PLACE, [receive, kind], op=op)
            return lambda: comm.Allreduce([send, kind], [receive, kind], op=op)
        if mode == "in-place":  # the whole input in the receive buffer, our block first
            return lambda: comm.Reduce_scatter_block(MPI.IN_PLACE, [receive, kind], op=op)
        return lambda: comm.Reduce_scatter_block([send, kind], [receive, kind], op=op)
