"""GPU two-shot all-reduce: rank r reduces chunk r of every input (in rank order, so each
element gets the one-shot's bits) into its result area and its output; after the middle
barrier every rank copies the other chunks from their owners. Each rank reads 1/n of
every input instead of all of it, so it wins once the bytes, not the barriers, cost."""

from __future__ import annotations

from ..agreement import Signature
from .gpu_kernel import GpuKernelAlgorithm

__all__ = ["GpuTwoShotAllReduce", "chunk_elements", "chunk_spans"]


def chunk_elements(count: int, itemsize: int, size: int) -> int:
    """Elements of a full chunk of the GPU two-shots: ceil(count / size) rounded up to 16
    bytes (kernels/src/collectives/two_shot_chunks.cuh, ``chunk_elements``)."""
    granule = 16 // itemsize
    per_rank = -(-count // size)
    return -(-per_rank // granule) * granule


def chunk_spans(count: int, itemsize: int, size: int) -> list[tuple[int, int]]:
    """``(byte offset, bytes)`` of each rank's chunk of a ``count``-element input, the
    last chunks shorter or empty (``chunk_length`` there)."""
    chunk = chunk_elements(count, itemsize, size)
    spans = []
    for rank in range(size):
        first = min(rank * chunk, count)
        last = min(first + chunk, count)
        spans.append((first * itemsize, (last - first) * itemsize))
    return spans


class GpuTwoShotAllReduce(GpuKernelAlgorithm):
    """Every input is read before the middle barrier, and a rank's own chunk is read by
    that rank alone, so an in-place output may be a zero-copy input."""

    name = "two-shot"
    op = "all_reduce"
    kernel = "all_reduce_two_shot"
    aliasing_safe = True
    bytes_per_block = 8 << 10

    def sliced_bytes(self, signature: Signature, size: int) -> int:
        return -(-signature.nbytes // max(size, 1))
