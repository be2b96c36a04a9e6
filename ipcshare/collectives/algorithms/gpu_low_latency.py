"""GPU low-latency (LL) one-shot all-reduce, reduce-scatter and all-gather: every rank
pushes its input (for reduce-scatter, each block to the rank that reduces it) into the
peers' LL buffers as 16-byte lines that carry the call's flag beside 8 bytes of data
(kernels/include/ipcshare/ll.cuh), and waits on its own buffer for every peer's lines.
One kernel with no barrier: the time is a launch plus one NVLink write, which is what
small calls are made of. Twice the bytes on the wire, so only for inputs up to the
window's LL buffers (``ScratchLayout.ll_max_bytes``); ``auto`` picks it where measured
faster (choice.py). The LL two-shot all-reduce makes two such rounds in one kernel (a
reduce-scatter, then an all-gather of the reduced chunks), so each rank sends 2(n-1)/n
of its input instead of n-1 times all of it: for the sizes where one-shot's bytes, not
its latency, set the time."""

from __future__ import annotations

from typing import Any

from ..agreement import Signature
from ..scratch import LL_LINE_PAYLOAD, ll_slot_payload_lines
from .gpu_kernel import GpuKernelAlgorithm
from .gpu_two_shot import chunk_elements

__all__ = ["GpuLowLatencyAllGather", "GpuLowLatencyAllReduce", "GpuLowLatencyReduceScatter",
           "GpuLowLatencyTwoShotAllReduce", "two_shot_region_lines"]


def two_shot_region_lines(count: int, itemsize: int, size: int) -> int:
    """Lines of each of the two regions an LL two-shot all-reduce of ``count`` elements
    writes in a slot, after its digest line: a full chunk's (the GPU two-shots' chunks,
    whole 16-byte granules, so whole lines), whatever the receiving rank's own chunk
    holds (kernels/src/collectives/low_latency.cuh, ``all_reduce_ll_two_shot``)."""
    return chunk_elements(count, itemsize, size) * itemsize // LL_LINE_PAYLOAD


class _LowLatency(GpuKernelAlgorithm):
    # A rank reads only its own input and its own buffer: any output may be any input, and
    # nothing is staged.
    aliasing_safe = True
    stages_input = False
    # Payload bytes per block: one line per thread keeps every line's wait in flight at
    # once, and blocks spread the pushes over SMs.
    bytes_per_block = 512 * LL_LINE_PAYLOAD

    def input_bytes(self, signature: Signature, size: int) -> int:
        return signature.nbytes

    def sliced_bytes(self, signature: Signature, size: int) -> int:
        return self.input_bytes(signature, size)

    def buffer_bytes(self, call: Any) -> int:
        """The largest input (reduce-scatter, all-to-all: block) the call's buffers take."""
        return call.ll_max_bytes

    def unsupported(self, call: Any) -> str | None:
        why = super().unsupported(call)
        if why is not None:
            return why
        nbytes = self.input_bytes(call.signature, call.size)
        room = self.buffer_bytes(call)
        if nbytes > room:
            return (f"its buffers take inputs of up to {room} bytes and this "
                    f"input has {nbytes}; use algo='auto', or another algorithm for calls "
                    "this large")
        return None


class GpuLowLatencyAllReduce(_LowLatency):
    """One-shot all-reduce in rank order (the same bits on every rank)."""

    name = "ll"
    op = "all_reduce"
    kernel = "all_reduce_ll"


class GpuLowLatencyReduceScatter(_LowLatency):
    """Rank p receives block p of every rank's input and reduces it in rank order; only
    that block travels to it, so a slot holds one block."""

    name = "ll"
    op = "reduce_scatter"
    kernel = "reduce_scatter_ll"

    def input_bytes(self, signature: Signature, size: int) -> int:
        return signature.nbytes // max(size, 1)


class GpuLowLatencyAllGather(_LowLatency):
    """All-gather of any dtype (bytes move); ``signature.nbytes`` is one rank's input."""

    name = "ll"
    op = "all_gather"
    kernel = "all_gather_ll_bytes"

    def entry(self, signature: Signature) -> str:
        return self.kernel


class GpuLowLatencyTwoShotAllReduce(_LowLatency):
    """Two-shot all-reduce in one kernel, by LL lines: rank p receives chunk p of every
    rank's input (region 0 of each sender's slot), reduces it in rank order and sends the
    result to every peer (region 1), which stores it. Each chunk is reduced by one rank,
    so every rank gets the same bits, the one-shot's. Inputs up to the LL buffers'
    ``ll_max_bytes`` whose two regions fit in a slot."""

    name = "ll-two-shot"
    op = "all_reduce"
    kernel = "all_reduce_ll_two_shot"

    def sliced_bytes(self, signature: Signature, size: int) -> int:
        # Every loop of the kernel runs over one chunk's lines: one line per thread.
        return chunk_elements(signature.count, signature.itemsize, size) * signature.itemsize

    def region_lines(self, signature: Signature, size: int) -> int:
        """Lines of each of the call's two regions in a slot."""
        return two_shot_region_lines(signature.count, signature.itemsize, size)

    def slot_lines(self, call: Any) -> int:
        """Lines a slot holds after its digest line (ScratchLayout.ll_slot_bytes)."""
        return ll_slot_payload_lines(call.ll_max_bytes, call.size)

    def unsupported(self, call: Any) -> str | None:
        why = super().unsupported(call)
        if why is not None:
            return why
        region = self.region_lines(call.signature, call.size)
        # The slots fit any input up to the buffers' limit: a guard against a call and a
        # layout that differ. A rank alone sends no lines.
        room = self.slot_lines(call)
        if call.size > 1 and 2 * region > room:
            return (f"its buffers hold {room} lines a rank and this input's two chunks need "
                    f"{2 * region}; use algo='auto', or another algorithm for calls this "
                    "large")
        return None
