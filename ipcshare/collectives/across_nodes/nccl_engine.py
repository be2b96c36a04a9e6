"""``--inter nccl``: the rail's collectives through NCCL (nccl4py), on device memory, queued
on the window's stream. One NCCL communicator per rail (local rank i of every node), made
when the engine opens: rail rank 0 makes the unique id, MPI broadcasts it over the rail.
Between nodes NCCL takes InfiniBand / RoCE with GPUDirect RDMA where the fabric has it
(docs/MULTINODE.md); on virtual nodes of one machine it takes NVLink or PCIe."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...backends.cuda_streams import stream_handle
from ...backends.device_buffer import DeviceArray
from ...liveness.consensus import collective_step
from ...runtime.nvlink_multicast import keep_multicast_off
from .engine import InterNodeEngine, check_nccl_possible, nccl4py_missing

__all__ = ["NcclInterEngine"]


class NcclInterEngine(InterNodeEngine):
    """Stream-ordered collectives over this rank's rail through one NCCL communicator.

    Collective over the group (every rank opens its rail's). The checks run first, on
    every rank, and are agreed on before any rank enters NCCL's initialisation, so a rank
    without nccl4py or a GPU makes every rank raise instead of leaving its rail waiting;
    a failure inside the initialisation itself is agreed on after it.

    Raises:
        ConfigError: host backend or nccl4py missing (on every rank).
        IpcShareError: the communicator could not be made on some rank (on every rank).
    """

    name = "nccl"
    stream_ordered = True

    def __init__(self, group: Any) -> None:
        world = group.world
        self._comm: Any = None
        with collective_step(world, "NCCL rail setup", watch=group.watch):
            check_nccl_possible(group.backend_name, nccl4py_missing())
            keep_multicast_off()
            import nccl.core as nccl

            self._nccl = nccl
            self._device = group.backend.device
            rail = world.rail_comm
            unique_id = nccl.get_unique_id() if rail.Get_rank() == 0 else None
        # nccl4py's UniqueId pickles; every rail broadcasts its own at once.
        unique_id = rail.bcast(unique_id, root=0)
        try:
            with collective_step(world, "NCCL rail communicator init", watch=group.watch):
                # NCCL takes the calling thread's current device: the backend made its
                # GPU's primary context current when it opened.
                self._comm = nccl.Communicator.init(rail.Get_size(), rail.Get_rank(),
                                                    unique_id)
        except BaseException:
            # Some rank failed: the ranks that got a communicator drop it, not leak it.
            made, self._comm = self._comm, None
            if made is not None:
                made.abort()
            raise
        self.rail_size, self.rail_rank = rail.Get_size(), rail.Get_rank()

    def _array(self, buffer: Any, dtype: str) -> Any:
        """``buffer`` as a typed array nccl4py takes: torch's view where torch imports
        (it spells bfloat16; nccl4py asks torch first), else a DeviceArray (DLPack / CUDA
        array interface)."""
        array = DeviceArray.viewing(buffer, dtype, device=self._device)
        try:
            import torch
        except ImportError:
            return array
        return torch.from_dlpack(array)

    def _op(self, op: str) -> Any:
        return getattr(self._nccl.NcclRedOp, op.upper())

    def allgatherv_in_place(self, engine: Any, output: Any, counts: list[int],
                            displacements: list[int]) -> Callable[[], None]:
        # Segments of other ranks sit apart (rail j's blocks are L blocks apart), so this
        # is one group of sends and receives, not ncclAllGather of one contiguous span.
        nccl, comm, me = self._nccl, self._comm, self.rail_rank
        stream = stream_handle(engine.stream)
        mine = self._array(output.slice(displacements[me], counts[me]), "uint8")
        others = [(peer, self._array(output.slice(displacements[peer], counts[peer]), "uint8"))
                  for peer in range(self.rail_size) if peer != me]

        def allgatherv() -> None:
            nccl.group_start()
            for peer, incoming in others:
                comm.send(mine, peer, stream=stream)
                comm.recv(incoming, peer, stream=stream)
            nccl.group_end()
        return allgatherv

    def all_reduce(self, engine: Any, buffer: Any, dtype: str, op: str) -> Callable[[], None]:
        comm, stream = self._comm, stream_handle(engine.stream)
        data, reduce_op = self._array(buffer, dtype), self._op(op)
        return lambda: comm.allreduce(data, data, reduce_op, stream=stream)

    def reduce_scatter(self, engine: Any, output: Any, input: Any, dtype: str,
                       op: str) -> Callable[[], None]:
        comm, stream, reduce_op = self._comm, stream_handle(engine.stream), self._op(op)
        source, target = self._array(input, dtype), self._array(output, dtype)
        return lambda: comm.reduce_scatter(source, target, reduce_op, stream=stream)

    def all_to_all(self, engine: Any, output: Any, input: Any) -> Callable[[], None]:
        comm, stream = self._comm, stream_handle(engine.stream)
        source, target = self._array(input, "uint8"), self._array(output, "uint8")
        return lambda: comm.alltoall(source, target, stream=stream)

    def close(self) -> None:
        """Destroy the rail's communicator (idempotent; collective over the rail)."""
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.destroy()
