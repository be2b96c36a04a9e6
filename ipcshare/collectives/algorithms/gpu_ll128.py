"""GPU all-gather, all-reduce, reduce-scatter, all-to-all and all-to-all-v by 128-byte
lines (``algo="ll128"``; ``"ll128-two-shot"`` for the two-shot all-reduce): the
low-latency kernels (gpu_low_latency.py, gpu_all_to_all_ll.py) with lines of 120 payload
bytes and a 64-bit flag, eight threads storing each line together, as NCCL's LL128
(kernels/include/ipcshare/ll128.cuh, kernels/src/collectives/low_latency_128.cuh,
all_reduce_ll128.cuh, all_to_all_ll128.cuh). The wire carries 1.07 times the input where
LL's 16-byte lines carry twice it, for the sizes where LL's bytes, not its one NVLink
trip, set the time. The call counts and checks its digest as an LL call (the
all-to-all-v's split rows travel as LL lines too); its data land in buffers of their own
(ScratchLayout.ll128_offset), which take inputs (blocks, for the all-to-alls) of up to the
window's ``ll128_max_bytes``. ``auto`` runs it where it was measured ahead of ``ll``,
``pull`` and ``one-shot`` (choice.py: all-gathers above 256-512 KiB up to 2 MiB gathered,
reduce-scatters above 1 MiB up to 4 MiB at 4 ranks and more; not yet the all-reduces or
the all-to-alls, which no 2- or 4-GPU node has run). It rests on 128-byte lines arriving
whole, which tools/probes/links/line_probe.py checks on every node kind."""

from __future__ import annotations

from typing import Any

from ..agreement import Signature
from ..scratch import LL128_LINE_BYTES, LL128_LINE_PAYLOAD, ll128_lines, ll128_slot_payload_lines
from .gpu_all_to_all_ll import GpuLowLatencyAllToAll, GpuLowLatencyAllToAllV
from .gpu_low_latency import (
    GpuLowLatencyAllGather,
    GpuLowLatencyAllReduce,
    GpuLowLatencyReduceScatter,
    GpuLowLatencyTwoShotAllReduce,
)
from .gpu_two_shot import chunk_elements

__all__ = ["GpuLL128AllGather", "GpuLL128AllReduce", "GpuLL128TwoShotAllReduce",
           "GpuLL128ReduceScatter", "GpuLL128AllToAll", "GpuLL128AllToAllV",
           "all_to_all_v_ll128_capacity"]

# Threads per block (gpu_kernel.THREADS) over the eight that move a line: one line per
# group of eight in every block, each block on its own SM's stores.
_LINES_PER_BLOCK = 512 // 8
_BYTES_PER_BLOCK = _LINES_PER_BLOCK * LL128_LINE_PAYLOAD


def all_to_all_v_ll128_capacity(ll128_slot_bytes: int) -> int:
    """The most bytes the LL128 all-to-all-v carries from one rank to another in a call:
    the payload of a slot's lines after its 128-byte head (all_to_all_ll128.cuh's
    ``all_to_all_v_ll128_capacity``), at least ``ll128_max_bytes``."""
    return max(0, ll128_slot_bytes // LL128_LINE_BYTES - 1) * LL128_LINE_PAYLOAD


class _LL128Buffers:
    """What every ll128 algorithm shares: a line per group of eight threads, and the
    LL128 buffers' limit (``ll128_max_bytes``) where the LL kernels have ``ll_max_bytes``.
    Listed first among the bases, so it overrides theirs."""

    bytes_per_block = _BYTES_PER_BLOCK

    def buffer_bytes(self, call: Any) -> int:
        return call.ll128_max_bytes


class GpuLL128AllGather(_LL128Buffers, GpuLowLatencyAllGather):
    """All-gather of any dtype (bytes move); ``signature.nbytes`` is one rank's input.
    Refused above ``ll128_max_bytes``: the LL128 slots hold that much."""

    name = "ll128"
    kernel = "all_gather_ll128_bytes"

    def entry(self, signature: Signature) -> str:
        return self.kernel


class GpuLL128AllReduce(_LL128Buffers, GpuLowLatencyAllReduce):
    """One-shot all-reduce by 128-byte lines: every rank's whole input to every peer,
    reduced in rank order (ll's bits); (n - 1) x 1.07 x the input out of each rank where
    ``ll`` sends (n - 1) x 2 (kernels/src/collectives/all_reduce_ll128.cuh)."""

    name = "ll128"
    kernel = "all_reduce_ll128"


class GpuLL128TwoShotAllReduce(_LL128Buffers, GpuLowLatencyTwoShotAllReduce):
    """Two-shot all-reduce in one kernel by 128-byte lines: rank p reduces chunk p of
    every input and sends it to every peer, as ``ll-two-shot`` does by 16-byte lines; each
    rank sends 2 (n - 1) / n x 1.07 x its input. Inputs up to ``ll128_max_bytes``."""

    name = "ll128-two-shot"
    kernel = "all_reduce_ll128_two_shot"

    def region_lines(self, signature: Signature, size: int) -> int:
        # A full chunk's lines (all_reduce_ll128.cuh's ``region``).
        return ll128_lines(chunk_elements(signature.count, signature.itemsize, size)
                           * signature.itemsize)

    def slot_lines(self, call: Any) -> int:
        return ll128_slot_payload_lines(call.ll128_max_bytes, call.size)


class GpuLL128ReduceScatter(_LL128Buffers, GpuLowLatencyReduceScatter):
    """Rank p receives block p of every rank's input as 128-byte lines and reduces it in
    rank order (the same bits as ``ll``'s); a slot holds one block."""

    name = "ll128"
    kernel = "reduce_scatter_ll128"


class GpuLL128AllToAll(_LL128Buffers, GpuLowLatencyAllToAll):
    """Even all-to-all of any dtype: block p of each rank's input travels to rank p alone,
    as 128-byte lines, and lands at block r of rank p's output. Nothing staged; in place
    is safe (a group of eight stores an output line only after it pushed that line of the
    input). Blocks up to ``ll128_max_bytes``."""

    name = "ll128"
    kernel = "all_to_all_ll128_bytes"


class GpuLL128AllToAllV(_LL128Buffers, GpuLowLatencyAllToAllV):
    """All-to-all-v by 128-byte lines, splits on the device and read at run time (graphs
    replay with new ones). Each sender's split row travels as LL lines in its LL slot, its
    block as LL128 lines in its LL128 slot; every rank checks every row, plus that no
    block passes a slot (kSplitTooLargeForLL128), so all ranks stop alike and move
    nothing."""

    name = "ll128"
    kernel = "all_to_all_v_ll128_bytes"
