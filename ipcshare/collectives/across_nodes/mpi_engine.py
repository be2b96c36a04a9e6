"""``--inter mpi``: the rail's collectives through MPI. Bytes move as ``MpiPath`` carries
them (host memory as it is; device memory by pointer to a CUDA-aware MPI, else through
host copies). Reductions are computed here, on the host, by the library's ``Reducer`` in
rail order (MPI has no bfloat16 and its own summation order): the gathered inputs come
to host memory and the result goes back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...liveness.deadline_waits import wait_request
from ...topology.world import mpi
from ..reduction import Reducer
from .engine import InterNodeEngine
from .mpi_path import MpiPath

__all__ = ["MpiInterEngine"]


class MpiInterEngine(InterNodeEngine):
    """Host-blocking collectives over ``World.rail_comm``; the caller synchronises the
    stream first (``stream_ordered`` is False)."""

    name = "mpi"
    stream_ordered = False

    def __init__(self, group: Any) -> None:
        self._comm = group.world.rail_comm
        self._device_memory = group.backend.device_memory
        # A rail step waits for peers on other nodes as a step inside a node waits for its
        # node's: up to the group's signal timeout, giving up at once on a node peer that
        # died. A blocking MPI call would wait for ever on a node whose step failed.
        watch, timeout = group.watch, group.signal_timeout

        def wait(request: Any, what: str) -> None:
            wait_request(request, watch=watch, timeout=timeout, what=what)
        self._wait = wait

    def allgatherv_in_place(self, engine: Any, output: Any, counts: list[int],
                            displacements: list[int]) -> Callable[[], None]:
        wait = self._wait
        return MpiPath(engine, self._device_memory).allgatherv_in_place(
            self._comm, output, counts, displacements,
            wait=lambda request: wait(request, "all-gather between nodes"))

    def _host_bytes(self, engine: Any, buffer: Any) -> tuple[Callable[[], np.ndarray],
                                                             Callable[[np.ndarray], None]]:
        """(read ``buffer``'s bytes to host, write host bytes back into ``buffer``):
        copies into arrays of their own (reductions run on the host, so a CUDA-aware MPI
        changes nothing here). What is read goes to a non-blocking send that may be given
        up on and complete later, when a late peer comes: it must not be the window's or
        the user's memory, which may be gone by then."""
        if MpiPath(engine, self._device_memory).mode == "host":
            view = np.asarray(buffer).view(np.uint8).reshape(-1)
            outgoing = np.empty_like(view)

            def read_host() -> np.ndarray:
                outgoing[:] = view
                return outgoing

            def write_host(data: np.ndarray) -> None:
                view[:] = data
            return read_host, write_host
        return (lambda: engine.download(buffer)), (lambda data: engine.upload(buffer, data))

    def all_reduce(self, engine: Any, buffer: Any, dtype: str, op: str) -> Callable[[], None]:
        comm, MPI, reduce, wait = self._comm, mpi(), Reducer(dtype, op), self._wait
        size, nbytes = comm.Get_size(), buffer.nbytes
        gathered = np.empty((size, nbytes), np.uint8)
        read, write = self._host_bytes(engine, buffer)
        result = np.empty(nbytes, np.uint8)

        def all_reduce() -> None:
            wait(comm.Iallgather([read(), MPI.BYTE], [gathered, MPI.BYTE]),
                 "all-reduce between nodes")
            reduce(list(gathered), result)  # rail order: node order
            write(result)
        return all_reduce

    def reduce_scatter(self, engine: Any, output: Any, input: Any, dtype: str,
                       op: str) -> Callable[[], None]:
        comm, MPI, reduce, wait = self._comm, mpi(), Reducer(dtype, op), self._wait
        size, block = comm.Get_size(), output.nbytes
        if input.nbytes != size * block:
            raise ValueError(f"reduce-scatter of {input.nbytes} bytes over {size} rail ranks "
                             f"into {block}")
        received = np.empty((size, block), np.uint8)
        read, _ = self._host_bytes(engine, input)
        _, write = self._host_bytes(engine, output)
        result = np.empty(block, np.uint8)

        def reduce_scatter() -> None:
            # Block i of every rail rank's input goes to rail rank i.
            wait(comm.Ialltoall([read(), MPI.BYTE], [received, MPI.BYTE]),
                 "reduce-scatter between nodes")
            reduce(list(received), result)
            write(result)
        return reduce_scatter

    def all_to_all(self, engine: Any, output: Any, input: Any) -> Callable[[], None]:
        comm, MPI, wait = self._comm, mpi(), self._wait
        if input.nbytes != output.nbytes or input.nbytes % comm.Get_size():
            raise ValueError(f"all-to-all of {input.nbytes} bytes into {output.nbytes} over "
                             f"{comm.Get_size()} rail ranks")
        read, _ = self._host_bytes(engine, input)
        _, write = self._host_bytes(engine, output)
        # MPI receives into an array of its own (a request given up on may complete late).
        received = np.empty(output.nbytes, np.uint8)

        def all_to_all() -> None:
            wait(comm.Ialltoall([read(), MPI.BYTE], [received, MPI.BYTE]),
                 "all-to-all between nodes")
            write(received)
        return all_to_all
