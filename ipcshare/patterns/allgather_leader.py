"""All-gather for ranks that share a GPU: one rank per GPU moves every block living there.

Without MPS the contexts of one GPU take turns in time slices. When every rank copies at
once, the contexts of a shared GPU keep preempting each other: a 1 MiB all-gather with
ranks 0 and 2 on one H200 took 281 us in copies alone, against 10.5 us with a GPU each
(tools/allgather_probe.py, nvidia-h200-x2, docs/GPU.md "Several ranks on one GPU"). Here
only the lowest rank on each GPU launches work: one kernel that writes the blocks of all
ranks on its GPU into every output, with no flags and no waits inside; the window's
barriers (met on the host where GPUs are shared) order it. The others only take part in
the barriers, so each GPU runs one context's work at a time.
"""

from __future__ import annotations

from collections.abc import Callable

from ..runtime.errors import ConfigError
from ..window import Window
from .allgather import AllGather
from .allgather_kernels import kernel_blocks, refuse_indirect_pairs
from .base import SizePlan

__all__ = ["LeaderAllGather", "gpu_leaders"]

_THREADS = 512


def gpu_leaders(window: Window) -> list[int]:
    """For each rank of the node (by world rank), the lowest rank on the same GPU."""
    leader = list(range(window.world_size))
    for ranks in window.shared_gpus.values():
        for rank in ranks:
            leader[rank] = min(ranks)
    return leader


class LeaderAllGather(AllGather):
    """``--algo leader``: per GPU, its lowest rank scatters the blocks of every rank on it
    (GPU backends, one node of at most 8 ranks)."""

    def __init__(self) -> None:
        super().__init__("leader")

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        from ..kernels.launcher import MAX_KERNEL_RANKS, ScatterArgs

        backend, n, me = window.backend, window.world_size, window.rank
        if not backend.has_kernels:
            raise ConfigError("--algo leader runs a kernel: it needs a GPU backend "
                              "(cuda-ipc or cuda-vmm), not host")
        if n > MAX_KERNEL_RANKS or window.world.node_count > 1:
            raise ConfigError(f"--algo leader works within one node of at most "
                              f"{MAX_KERNEL_RANKS} ranks; this job has {n} on "
                              f"{window.world.node_count} node(s)")
        refuse_indirect_pairs(window, "--algo leader")
        leader = gpu_leaders(window)
        barrier = window.barrier
        if leader[me] != me:
            def follow() -> None:
                barrier()   # outputs free: the leader of our GPU may write them
                barrier()   # every block landed
            return follow
        args = ScatterArgs()
        for rank in range(n):
            args.outputs[rank] = window.peer(rank).ptr + self._recv_offset(plan)
            args.inputs[rank] = self._send_of(window, rank, plan, mode).ptr
        args.block_bytes, args.nranks = plan.block_bytes, n
        args.sources = sum(1 << rank for rank in range(n) if leader[rank] == me)
        scatter = backend.kernels("allgather.cu").launcher(
            "allgather_scatter", args, grid=kernel_blocks(plan.block_bytes), block=_THREADS,
            stream=window.engine.stream)

        def lead() -> None:
            barrier()
            scatter()
            barrier()
        return lead
