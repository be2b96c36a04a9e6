"""GPU all-to-all and all-to-all-v, pull (kernels/src/collectives/all_to_all.cuh): each
rank stages its input (unless peers read it in place), meets its peers once, and reads
from every rank's input the segment addressed to it into its own output (outputs are the
user's arrays, which peers cannot map, so nobody pushes). All-to-all-v takes its counts
from device arrays at run time or from the host; every rank checks every rank's splits
on the GPU, so ranks that disagree all stop alike (synchronize() names the pair)."""

from __future__ import annotations

from ..agreement import Signature
from .gpu_kernel import GpuCall, GpuKernelAlgorithm

__all__ = ["GpuPullAllToAll", "GpuPullAllToAllV", "max_bytes_grid"]


def max_bytes_grid(call: GpuCall, bytes_per_block: int) -> int:
    """The grid of an all-to-all-v whose kernel cuts every rank's bytes alike on every
    rank (pull, balanced, push): one block per ``bytes_per_block`` of the communicator's
    ``max_bytes`` (the counts may be known only on the GPU, and ranks' arrays differ),
    1 to ``call.max_blocks``."""
    return max(1, min(call.max_blocks, -(-call.max_bytes // bytes_per_block)))


class GpuPullAllToAll(GpuKernelAlgorithm):
    """Any dtype (bytes move). In place, the output is the input: a staged input may be
    (each block writes a slice of the output only after staging that slice of the input
    itself), but one that peers read in place may not, so the path stages it."""

    name = "pull"
    op = "all_to_all"
    kernel = "all_to_all_pull_bytes"
    aliasing_safe = False
    # Each block reads its slice of every peer's segment.
    bytes_per_block = 16 << 10

    def entry(self, signature: Signature) -> str:
        return self.kernel


class GpuPullAllToAllV(GpuPullAllToAll):
    """The counts of each call are only known on the GPU (they may live there), but
    every rank must cut the same grid: the grid follows the communicator's ``max_bytes``,
    the largest input a call may send."""

    op = "all_to_all_v"
    kernel = "all_to_all_v_pull_bytes"

    def run(self, call: GpuCall) -> None:
        call.launch(self.entry(call.signature), max_bytes_grid(call, self.bytes_per_block))
