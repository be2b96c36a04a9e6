"""The MPI baseline of the all-to-all case: mpi4py Alltoall (even splits) or Alltoallv
(the case's split matrix) on host numpy buffers, the case's seeded data and checks,
timed as the MPI all-gather baseline is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..patterns.base import SizePlan
from ..patterns.seeding import count_wrong, poison
from ..topology.world import World, mpi
from .mpi import MpiBaseline

__all__ = ["MpiAllToAllBaseline"]


class MpiAllToAllBaseline(MpiBaseline):
    """Times MPI's all-to-all on ``case``'s sizes, splits and data. In place: Alltoall
    with MPI_IN_PLACE for even splits; MPI's in-place Alltoallv sends what it receives
    (one layout for both), so uneven splits in place copy the array aside and run
    Alltoallv from the copy into it, as an MPI program does."""

    def __init__(self, world: World, case: Any) -> None:
        super().__init__(world, "allgather")
        self.op = case.name
        self.case = case

    def _checked_operations(self, plan: SizePlan, mode: str, checks: int,
                            buffers: int) -> tuple[list[Callable[[], None]], int]:
        n, me, case = self.world.size, self.world.rank, self.case
        received = case.received_bytes(plan, me, n)
        receive_bytes = case.array_bytes(plan, n) if mode == "in-place" else received
        pairs = [(np.empty(plan.size, np.uint8), np.empty(receive_bytes, np.uint8))
                 for _ in range(buffers)]
        operations = [self._all_to_all(send, receive, plan, mode) for send, receive in pairs]
        wrong = 0
        for iteration in range(checks):
            send, receive = pairs[iteration % buffers]
            data = case.input_bytes(plan, me, n, iteration)
            receive[:] = poison(receive.nbytes)
            if mode == "in-place":
                receive[:plan.size] = data
            else:
                send[:] = data
            operations[iteration % buffers]()
            wrong += count_wrong(receive[:received], case.expected_bytes(plan, me, n, iteration),
                                 plan.element_size)
        return operations, self.world.comm.allreduce(wrong, op=mpi().SUM)

    def _all_to_all(self, send: np.ndarray, receive: np.ndarray, plan: SizePlan,
                    mode: str) -> Callable[[], None]:
        MPI = mpi()
        comm, n, me = self.world.comm, self.world.size, self.world.rank
        if self.case.splits == "even":
            if mode == "in-place":
                return lambda: comm.Alltoall(MPI.IN_PLACE, [receive, MPI.BYTE])
            return lambda: comm.Alltoall([send, MPI.BYTE], [receive, MPI.BYTE])
        m = self.case.split_matrix(plan, n) * plan.element_size   # in bytes
        send_counts, receive_counts = m[me].tolist(), m[:, me].tolist()
        send_displs = np.concatenate(([0], np.cumsum(m[me])[:-1])).tolist()
        receive_displs = np.concatenate(([0], np.cumsum(m[:, me])[:-1])).tolist()
        outgoing = [send, send_counts, send_displs, MPI.BYTE]
        incoming = [receive, receive_counts, receive_displs, MPI.BYTE]
        if mode == "in-place":
            def aside_then_all_to_all() -> None:
                send[:] = receive[:send.nbytes]
                comm.Alltoallv(outgoing, incoming)
            return aside_then_all_to_all
        return lambda: comm.Alltoallv(outgoing, incoming)
