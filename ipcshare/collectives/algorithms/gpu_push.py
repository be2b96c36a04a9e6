"""GPU push all-reduce, reduce-scatter and all-gather: every byte between GPUs is a store of the SMs
into a peer's window, never a remote load (the fanned-out push all-gather stored 316-352
GB/s over NVLink on 2 H200s where the pull kernel's loads came back at about 240), and
each block signals its slice tile by tile, so its stores of the next tile stay in flight
while it waits for and reduces the current one (kernels/src/collectives/push.cuh has the
layout and the safety argument).

All-reduce is a two-shot: rank q reduces chunk q from every rank's pushed chunk and
stores the result into every peer's output where the peer's header says it can reach it
(the peer's heap, or a registered array), else into the peer's result area, from which
the peer copies it into its output. Reduce-scatter is its first half. Each rank moves
(n - 1) / n of the input out and in, as two-shot does, with no barrier between phases and
nothing staged: the algorithm for the bandwidth-bound sizes, where ``auto`` runs both
(choice.py: the all-reduce above 2 MiB at 4 ranks and more and above 8 MiB at 2, the
reduce-scatter above 4 MiB and 8 MiB; not at 3 ranks, where push has not been timed at
these sizes). All-gather stores
each tile of the input, loaded once, into every peer's output where reachable, else into
its inbox, after one meeting at the start (the first store needs the peer's place)."""

from __future__ import annotations

from typing import ClassVar

from ..agreement import Signature
from .gpu_kernel import GpuCall, GpuKernelAlgorithm

__all__ = ["GpuPushAllGather", "GpuPushAllReduce", "GpuPushReduceScatter"]


class _Push(GpuKernelAlgorithm):
    # No peer reads our input or output (peers store into our inbox and result area), so
    # any output may be the input and nothing is staged.
    aliasing_safe = True
    stages_input = False
    # A block's share of a chunk, which it signals in tiles of tile_bytes.
    bytes_per_block = 8 << 10
    # Each tile costs the block a fence and a signal. On one H100 (2 ranks under MPS,
    # 2026-11-24, `ipcshare allreduce --algo push --graph`) a 256 MiB all-reduce took
    # 1193 us with tiles of 32 KiB, 1010 with 128 KiB, 938 with 512 KiB and 933 with
    # 4 MiB (one tile per slice); reduce-scatter 735 / 651 / 618 / 613. 512 KiB keeps a
    # few tiles per block from 128 MiB up; GPUs of their own may move it. The same on
    # every rank (a class attribute: tests set it smaller to reach many tiles cheaply).
    tile_bytes: ClassVar[int] = 512 << 10

    def run(self, call: GpuCall) -> None:
        call.args.push_tile_bytes = self.tile_bytes
        super().run(call)


class GpuPushAllReduce(_Push):
    """Two-shot all-reduce by stores: chunk q is reduced in rank order by rank q alone,
    so every rank gets the one-shot's bits."""

    name = "push"
    op = "all_reduce"
    kernel = "all_reduce_push"

    def sliced_bytes(self, signature: Signature, size: int) -> int:
        return -(-signature.nbytes // max(size, 1))


class GpuPushReduceScatter(_Push):
    """Rank q's output is block q reduced in rank order from every rank's pushed block."""

    name = "push"
    op = "reduce_scatter"
    kernel = "reduce_scatter_push"

    def sliced_bytes(self, signature: Signature, size: int) -> int:
        return signature.nbytes // max(size, 1)


class GpuPushAllGather(_Push):
    """Any dtype (bytes move); in place, peers store only into the blocks that are not
    this rank's input."""

    name = "push"
    op = "all_gather"
    kernel = "all_gather_push_bytes"
    bytes_per_block = 16 << 10

    def entry(self, signature: Signature) -> str:
        return self.kernel
