"""GPU all-gather, pull: each rank stages its input, meets its peers, and reads every
rank's block straight into its own output (outputs are the user's arrays, which peers
cannot map, so nobody pushes)."""

from __future__ import annotations

from ..agreement import Signature
from .gpu_kernel import GpuKernelAlgorithm

__all__ = ["GpuPullAllGather"]


class GpuPullAllGather(GpuKernelAlgorithm):
    """Any dtype (bytes move). In place, a rank's input is its own block of its output,
    which it does not write, so a zero-copy input may be it."""

    name = "pull"
    op = "all_gather"
    kernel = "all_gather_pull_bytes"
    aliasing_safe = True
    bytes_per_block = 16 << 10

    def entry(self, signature: Signature) -> str:
        return self.kernel
