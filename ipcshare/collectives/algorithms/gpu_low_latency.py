"""GPU low-latency (LL) one-shot all-reduce, reduce-scatter and all-gather: every rank
pushes its input (for reduce-scatter, each block to the rank that reduces it) into the
peers' LL buffers as 16-byte lines that carry the call's flag beside 8 bytes of data
(kernels/include/ipcshare/ll.cuh), and waits on its own buffer for every peer's lines.
One kernel with no barrier: the time is a launch plus one NVLink write, which is what
small calls are made of. Twice the bytes on the wire, so only for inputs up to the
window's LL buffers (``ScratchLayout.ll_max_bytes``); ``auto`` picks it where measured
faster (choice.py)."""

from __future__ import annotations

from typing import Any

from ..agreement import Signature
from ..scratch import LL_LINE_PAYLOAD
from .gpu_kernel import GpuKernelAlgorithm

__all__ = ["GpuLowLatencyAllGather", "GpuLowLatencyAllReduce", "GpuLowLatencyReduceScatter"]


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

    def unsupported(self, call: Any) -> str | None:
        why = super().unsupported(call)
        if why is not None:
            return why
        nbytes = self.input_bytes(call.signature, call.size)
        if nbytes > call.ll_max_bytes:
            return (f"its buffers take inputs of up to {call.ll_max_bytes} bytes and this "
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
