"""GPU all-to-all, low-latency (kernels/src/collectives/all_to_all_ll.cuh): the LL protocol
of the small all-gathers, all-reduces and reduce-scatters (gpu_low_latency.py) for
all-to-alls of even splits. Rank r pushes block p of its input into its slot of rank p's
LL buffer as 16-byte lines carrying the call's flag, and waits on its own buffer for block
r of every peer: no barrier, so a call costs a launch and one NVLink write, where pull and
balanced meet their peers first (a round trip or two). Lines double the bytes on the wire,
and a slot holds ``ScratchLayout.ll_max_bytes``: calls whose blocks are larger are refused.
``auto`` runs it for even splits up to 512 KiB (measured at 2-4 ranks: choice.py).

All-to-all-v (``GpuLowLatencyAllToAllV``, kernel ``all_to_all_v_ll`` in the same file):
the splits stay on the device and are read at run time, so graphs replay with new ones.
Each sender's slot carries its split row (a line a word) before its block; every rank
checks every row as pull does, plus that no block is larger than a slot, so all ranks
stop alike on the same problem and move nothing. ``auto`` picks it on communicators whose
max_bytes is at most 2 MiB at 2 ranks and 512 KiB at more: every block of every call then
fits a slot, whatever the counts (choice.py has the figures)."""

from __future__ import annotations

from typing import Any

from ..agreement import Signature
from ..scratch import LL_LINE_BYTES, LL_LINE_PAYLOAD, split_row_words
from .gpu_kernel import GpuCall, GpuKernelAlgorithm
from .gpu_low_latency import GpuLowLatencyReduceScatter

__all__ = ["GpuLowLatencyAllToAll", "GpuLowLatencyAllToAllV", "all_to_all_v_block_capacity"]


def all_to_all_v_block_capacity(ll_slot_bytes: int, world_size: int) -> int:
    """The most bytes the LL all-to-all-v carries from one rank to another in a call:
    what a slot of ``ll_slot_bytes`` holds after the digest line and the sender's split
    row (all_to_all_ll.cuh's ``all_to_all_v_ll_capacity``). ScratchLayout makes it at
    least ``ll_max_bytes``; the alignment of the slot may add a little."""
    taken = 1 + split_row_words(world_size)
    return max(0, ll_slot_bytes // LL_LINE_BYTES - taken) * LL_LINE_PAYLOAD


class GpuLowLatencyAllToAll(GpuLowLatencyReduceScatter):
    """Any dtype (bytes move). A block, the bytes one rank sends another, travels to its
    rank alone, as reduce-scatter's: so the grid, the slot each block must fit and the
    placement (nothing staged, and in place safe with any input: a rank reads only its
    own input and buffer, and each thread writes a line of the output only after it has
    pushed that line of the input) are reduce-scatter's."""

    op = "all_to_all"
    kernel = "all_to_all_ll_bytes"

    def entry(self, signature: Signature) -> str:
        return self.kernel

    def unsupported(self, call: Any) -> str | None:
        # Reduce-scatter's answer, in words of all-to-all where the slot is what refuses.
        why = super().unsupported(call)
        block = self.input_bytes(call.signature, call.size)
        room = self.buffer_bytes(call)
        if why is None or block <= room:
            return why
        return (f"its buffers take blocks (the bytes a rank sends each rank) of up to "
                f"{room} bytes and this call's are {block} "
                f"({call.signature.nbytes} bytes over {call.size} ranks); use algo='auto', "
                "or another algorithm for calls this large")


class GpuLowLatencyAllToAllV(GpuLowLatencyAllToAll):
    """All-to-all-v by LL lines, splits on the device. Nothing on the host knows the
    blocks (device splits), so nothing is refused here for its size: a block larger
    than a slot is found by every rank in the rows (kSplitTooLargeForLL) and
    synchronize() raises it on every rank, the output untouched. In place is refused
    before any algorithm is asked (Communicator.all_to_all_v on GPUs: blocks move), and
    time-sliced GPUs for every all-to-all (Communicator._refuse_all_to_all)."""

    op = "all_to_all_v"
    kernel = "all_to_all_v_ll_bytes"

    def unsupported(self, call: Any) -> str | None:
        # The world size only: the signature of an all-to-all-v has no count.
        return GpuKernelAlgorithm.unsupported(self, call)

    def grid_bytes(self, call: GpuCall) -> int:
        """The bytes a line per thread must cover: a block this rank sends is at most its
        input, one it receives at most its output, and none passes a slot. The ranks' grids
        may differ: LL blocks never wait for blocks of a peer (only for its lines, whoever
        pushes them), so each rank sizes its own from its own arrays and a small call
        launches few blocks. Without the arrays, the LL buffers' size."""
        args = call.args
        if args is None or not hasattr(args, "output_count"):
            return self.buffer_bytes(call)
        largest = max(args.count, args.output_count) * args.itemsize
        return min(largest, self.buffer_bytes(call))

    def run(self, call: GpuCall) -> None:
        # One line per thread (LL) or per group of eight (LL128): bytes_per_block's lines.
        call.launch(self.entry(call.signature),
                    max(1, min(call.max_blocks, -(-self.grid_bytes(call) // self.bytes_per_block))))
