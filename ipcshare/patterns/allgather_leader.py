"""All-gather for ranks that share a GPU: one rank per GPU moves every block living there.

Without MPS the contexts of one GPU take turns in time slices. When every rank copies at
once, the contexts of a shared GPU keep preempting each other: a 1 MiB all-gather with
ranks 0 and 2 on one H200 took 281 us in copies alone, against 10.5 us with a GPU each
(tools/probes/timing/allgather_probe.py, 2 x H200, docs/GPU.md "Several ranks on one GPU"). Here
only the lowest rank on each GPU launches work: one kernel that writes the blocks of all
ranks on its GPU into every output, with no flags and no waits inside; the window's
barriers (met on the host where GPUs are shared) order it. The others only take part in
the barriers, so each GPU runs one context's work at a time. In a CUDA graph the others
put no barrier on their streams either: their leader meets the barriers for them, and they
only hand the call over (``_bind_for_graphs``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..runtime.errors import ConfigError
from ..window import Window
from ..window.layout import GUEST_DONE_SLOT, GUEST_READY_SLOT
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
        from ..kernels.launcher import MAX_KERNEL_RANKS

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
        if getattr(window, "graph_safe", False) and window.time_sliced_gpus:
            return self._bind_for_graphs(window, plan, mode, leader)
        barrier = window.barrier
        if leader[me] != me:
            def follow() -> None:
                barrier()   # outputs free: the leader of our GPU may write them
                barrier()   # every block landed
            return follow
        scatter = self._scatter(window, plan, mode, leader)

        def lead() -> None:
            barrier()
            scatter()
            barrier()
        return lead

    def _scatter(self, window: Window, plan: SizePlan, mode: str,
                 leader: list[int]) -> Callable[[], None]:
        """The kernel that writes the block of every rank led by this one into every
        output."""
        from ..kernels.launcher import ScatterArgs

        n, me = window.world_size, window.rank
        args = ScatterArgs()
        for rank in range(n):
            args.outputs[rank] = window.peer(rank).ptr + self._recv_offset(plan)
            args.inputs[rank] = self._send_of(window, rank, plan, mode).ptr
        args.block_bytes, args.nranks = plan.block_bytes, n
        args.sources = sum(1 << rank for rank in range(n) if leader[rank] == me)
        return window.backend.kernels("allgather.cu").launcher(
            "allgather_scatter", args, grid=kernel_blocks(plan.block_bytes), block=_THREADS,
            stream=window.engine.stream)

    def _bind_for_graphs(self, window: Window, plan: SizePlan, mode: str,
                         leader: list[int]) -> Callable[[], None]:
        """In a CUDA graph, on GPUs that take turns: each flag barrier put on a guest's
        stream makes the GPU switch to the guest's context and back (5 ranks on one H100:
        73 us per 1 MiB all-gather in graphs against 8 eager). So only a GPU's lowest
        rank meets the barriers, for every rank on it; a guest's stream only says that it
        reached the call (its input ready, its output free) and waits until its leader
        says the call is done, in one batch of stream operations."""
        me = window.rank
        engine, stream = window.engine, window.stream
        pads = {rank: window.signal_pad(rank) for rank in range(window.world_size)}
        timeout = window.signal_timeout
        if leader[me] != me:
            barrier = window.graph_party_barrier(stream, [])
            hand_over = engine.make_signal_batch(
                [("write", pads[me], GUEST_READY_SLOT, 1),
                 ("wait", pads[me], GUEST_DONE_SLOT, 1,
                  f"rank {me} waiting for rank {leader[me]}, which runs its all-gather on "
                  "the GPU they share, to finish it"),
                 ("write", pads[me], GUEST_DONE_SLOT, 0)], timeout=timeout)

            def follow() -> None:
                barrier()   # no work: keeps the window's alternation of flag sets
                hand_over()
                barrier()
            return follow
        guests = [rank for rank in range(window.world_size)
                  if leader[rank] == me and rank != me]
        barrier = window.graph_party_barrier(stream, [me, *guests])
        take = engine.make_signal_batch(
            [step for guest in guests for step in (
                ("wait", pads[guest], GUEST_READY_SLOT, 1,
                 f"rank {me} waiting for rank {guest}, which shares its GPU, to reach the "
                 "all-gather"),
                ("write", pads[guest], GUEST_READY_SLOT, 0))],
            timeout=timeout) if guests else None
        release = engine.make_signal_batch(
            [("write", pads[guest], GUEST_DONE_SLOT, 1) for guest in guests],
            timeout=timeout) if guests else None
        scatter = self._scatter(window, plan, mode, leader)

        def lead() -> None:
            if take is not None:
                take()
            barrier()   # every output free, every input ready, on every GPU
            scatter()
            barrier()   # every block landed
            if release is not None:
                release()
        return lead
