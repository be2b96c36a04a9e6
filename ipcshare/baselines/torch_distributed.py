"""The torch baseline: NCCL through torch.distributed (all_gather_into_tensor, batched
isend / irecv, all_reduce, reduce_scatter_tensor, all_to_all_single) on device tensors:
what a PyTorch user pays, torch's host work included. Same sizes, data, checks and timing
as every GPU baseline (``baselines.gpu``)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from ..liveness.consensus import collective_step
from ..patterns.base import SizePlan
from ..runtime.errors import ConfigError
from ..runtime.nvlink_multicast import keep_multicast_off
from ..topology.world import World
from .gpu import (
    ALL_TO_ALL,
    REDUCTION_OPS,
    GpuBaseline,
    all_to_all_splits,
    check_one_gpu_per_rank,
    import_torch_cuda,
)
from .torch_rendezvous import start_nccl_process_group

__all__ = ["TorchBaseline", "torch_split_sizes"]

_OPS = ("allgather", "ring", *REDUCTION_OPS, ALL_TO_ALL)


def torch_split_sizes(case: Any, plan: SizePlan, world_size: int, rank: int
                      ) -> dict[str, list[int]]:
    """The split keywords of rank ``rank``'s ``all_to_all_single`` on byte tensors at
    ``plan``: none for even splits (torch cuts equal blocks itself), else
    ``output_split_sizes`` (bytes from each rank) and ``input_split_sizes`` (bytes to
    each rank) from the case's split matrix."""
    splits = all_to_all_splits(case, plan, world_size, rank)
    if splits.even:
        return {}
    return {"output_split_sizes": list(splits.receive),
            "input_split_sizes": list(splits.send)}


class TorchBaseline(GpuBaseline):
    """Times the NCCL equivalent of a pattern through torch.distributed.

    Collective over ``world``: creates a NCCL process group with the MPI ranks and sizes
    (TCP rendezvous at a port rank 0 picks). ``device`` is this rank's CUDA ordinal, the
    one the ipcshare backend bound (None on the host backend). ``close()`` destroys the
    process group. Out-of-place all-reduce is a copy then torch's in-place all_reduce
    (torch.distributed has no other).

    Raises:
        ConfigError: an op it cannot time, torch missing or without CUDA / NCCL, no
            device, or two ranks on one GPU; on every rank.
    """

    name = "torch"
    label = "NCCL through torch.distributed"

    def __init__(self, world: World, case: Any, device: int | None) -> None:
        keep_multicast_off()
        self._group_ready = False
        flag = f"--baseline {self.name}"
        with collective_step(world, f"{self.name} baseline setup"):
            type(self).check_case(case)
            torch = import_torch_cuda(flag)
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_nccl_available():
                raise ConfigError(f"{flag} needs torch.distributed with NCCL; this torch "
                                  "build has none")
            if device is None:
                raise ConfigError(f"{flag} needs a GPU backend (cuda-ipc or cuda-vmm), not "
                                  "host; use --baseline mpi")
            self._check_world(world)
            super().__init__(world, case, torch, int(device))
        check_one_gpu_per_rank(world, self.device.index, flag)
        self._dist = dist
        raw_version = torch.cuda.nccl.version()
        nccl_version = (".".join(str(part) for part in raw_version)
                        if isinstance(raw_version, tuple) else str(raw_version))
        self.version = f"NCCL {nccl_version} (torch {torch.__version__.split('+')[0]})"
        host = "127.0.0.1" if world.node_count == 1 else socket.gethostname()
        host = world.comm.bcast(host, root=0)
        # Another baseline of this process (a bench suite's) may have made it already.
        if not dist.is_initialized():
            with collective_step(world, "torch.distributed process group init"):
                start_nccl_process_group(dist, world.comm, rank=world.rank,
                                         size=world.size, device=self.device, host=host)
                self._group_ready = True
        # The first collective builds NCCL's communicators; keep it out of every timing.
        dist.barrier(device_ids=[self.device.index])
        torch.cuda.synchronize(self.device)

    @classmethod
    def check_case(cls, case: Any) -> None:
        if case.name not in _OPS:
            raise ConfigError(f"--baseline {cls.name} times {', '.join(_OPS)}, not "
                              f"{case.name}")

    def _check_world(self, world: World) -> None:
        """Raise for a world this baseline cannot span (subclasses narrow it)."""

    def _bind(self, path: str | None, inputs: Any, output: Any, plan: SizePlan,
              mode: str) -> Callable[[], None]:
        dist = self._dist
        if self.op == ALL_TO_ALL:
            return self._all_to_all(path, inputs, output, plan)
        if self.op == "allgather":
            return lambda: dist.all_gather_into_tensor(output, inputs)
        if self.op == "ring":
            return self._ring(output, plan.block_bytes)
        reduce_op = getattr(dist.ReduceOp, self.case.op.upper())
        if self.op == "reducescatter":
            return lambda: dist.reduce_scatter_tensor(output, inputs, op=reduce_op)
        if inputs.data_ptr() == output.data_ptr():
            return lambda: dist.all_reduce(output, op=reduce_op)

        def copy_then_reduce() -> None:
            output.copy_(inputs)
            dist.all_reduce(output, op=reduce_op)
        return copy_then_reduce

    def _all_to_all(self, path: str | None, inputs: Any, output: Any,
                    plan: SizePlan) -> Callable[[], None]:
        """``all_to_all_single`` on byte tensors, with the case's split sizes where they
        are uneven; in place, the array copied aside first (``_all_to_all_source``)."""
        dist = self._dist
        source, copy_aside = self._all_to_all_source(path, inputs, output)
        sizes = torch_split_sizes(self.case, plan, self.world.size, self.world.rank)

        def all_to_all() -> None:
            if copy_aside is not None:
                copy_aside()
            dist.all_to_all_single(output, source, **sizes)
        return all_to_all

    def _ring(self, output: Any, block: int) -> Callable[[], None]:
        dist = self._dist
        n, me = self.world.size, self.world.rank
        views = [output[r * block:(r + 1) * block] for r in range(n)]
        if n == 1:
            return lambda: views[0].copy_(views[0])
        nxt, prev = (me + 1) % n, (me - 1) % n
        steps = []
        for step in range(n - 1):
            out, into = (me - step) % n, (me - step - 1) % n
            steps.append([dist.P2POp(dist.isend, views[out], nxt),
                          dist.P2POp(dist.irecv, views[into], prev)])

        def ring() -> None:
            for ops in steps:
                for request in dist.batch_isend_irecv(ops):
                    request.wait()
        return ring

    def close(self) -> None:
        """Destroy the process group if this baseline made it (idempotent; collective
        like its creation; a view from ``for_pattern`` owns nothing)."""
        if self._owner and self._group_ready:
            self._group_ready = False
            self._dist.destroy_process_group()
