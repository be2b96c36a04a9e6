"""GPU one-shot reductions: after the entry barrier every rank reads its part of every
rank's input over NVLink and reduces it in rank order (all of it for all-reduce, its own
block for reduce-scatter). One kernel, one barrier; a second when some input is read in
place (from ``empty()``), so its owner cannot overwrite it while a peer reads."""

from __future__ import annotations

from ..agreement import Signature
from .gpu_kernel import GpuKernelAlgorithm

__all__ = ["GpuOneShotAllReduce", "GpuOneShotReduceScatter"]


class GpuOneShotAllReduce(GpuKernelAlgorithm):
    """Every rank reads the whole of every input: an output that is its own zero-copy
    input would be overwritten while peers read it, so such an input is copied in."""

    name = "one-shot"
    op = "all_reduce"
    kernel = "all_reduce_one_shot"
    aliasing_safe = False
    # Each block reads its slice from every rank: small slices keep every SM busy.
    bytes_per_block = 8 << 10


class GpuOneShotReduceScatter(GpuKernelAlgorithm):
    """Rank r reads block r of every input; in place, its output is block r of its own
    input, which no peer reads."""

    name = "one-shot"
    op = "reduce_scatter"
    kernel = "reduce_scatter_one_shot"
    aliasing_safe = True
    bytes_per_block = 8 << 10

    def sliced_bytes(self, signature: Signature, size: int) -> int:
        return signature.nbytes // max(size, 1)
