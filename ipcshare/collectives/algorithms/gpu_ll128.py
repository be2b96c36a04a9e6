"""GPU all-gather and reduce-scatter by 128-byte lines (``algo="ll128"``): the
low-latency kernels (gpu_low_latency.py) with lines of 120 payload bytes and a 64-bit
flag, eight threads storing each line together, as NCCL's LL128 (kernels/include/ipcshare/ll128.cuh,
kernels/src/collectives/low_latency_128.cuh). The wire carries 1.07 times the input
where LL's 16-byte lines carry twice it, for the sizes where LL's bytes, not its one
NVLink trip, set the time. The call counts and checks its digest as an LL call; its data
land in buffers of their own (ScratchLayout.ll128_offset). Inputs up to the window's
``ll_max_bytes``. ``auto`` runs it where it was measured ahead of ``ll``, ``pull`` and
``one-shot`` (choice.py: all-gathers above 256-512 KiB up to 2 MiB gathered,
reduce-scatters above 1 MiB up to 4 MiB at 4 ranks and more); it rests on 128-byte lines
arriving whole, which tools/line_probe.py checks."""

from __future__ import annotations

from ..agreement import Signature
from ..scratch import LL128_LINE_PAYLOAD
from .gpu_low_latency import GpuLowLatencyAllGather, GpuLowLatencyReduceScatter

__all__ = ["GpuLL128AllGather", "GpuLL128ReduceScatter"]

# Threads per block (gpu_kernel.THREADS) over the eight that move a line.
_LINES_PER_BLOCK = 512 // 8


class GpuLL128AllGather(GpuLowLatencyAllGather):
    """All-gather of any dtype (bytes move); ``signature.nbytes`` is one rank's input.
    Refused above ``ll_max_bytes``, as ``ll``: the LL128 slots hold that much."""

    name = "ll128"
    kernel = "all_gather_ll128_bytes"
    # One line per group of eight threads in every block, each on its own SM's stores.
    bytes_per_block = _LINES_PER_BLOCK * LL128_LINE_PAYLOAD

    def entry(self, signature: Signature) -> str:
        return self.kernel


class GpuLL128ReduceScatter(GpuLowLatencyReduceScatter):
    """Rank p receives block p of every rank's input as 128-byte lines and reduces it in
    rank order (the same bits as ``ll``'s); a slot holds one block."""

    name = "ll128"
    kernel = "reduce_scatter_ll128"
    bytes_per_block = _LINES_PER_BLOCK * LL128_LINE_PAYLOAD
