"""GPU all-to-all, low-latency (kernels/src/collectives/all_to_all_ll.cuh): the LL protocol
of the small all-gathers, all-reduces and reduce-scatters (gpu_low_latency.py) for
all-to-alls of even splits. Rank r pushes block p of its input into its slot of rank p's
LL buffer as 16-byte lines carrying the call's flag, and waits on its own buffer for block
r of every peer: no barrier, so a call costs a launch and one NVLink write, where pull and
balanced meet their peers first (a round trip or two). Lines double the bytes on the wire,
and a slot holds ``ScratchLayout.ll_max_bytes``: calls whose blocks are larger are refused.
``auto`` runs it for even splits up to 512 KiB (measured at 2-4 ranks: choice.py)."""

from __future__ import annotations

from typing import Any

from ..agreement import Signature
from .gpu_low_latency import GpuLowLatencyReduceScatter

__all__ = ["GpuLowLatencyAllToAll"]


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
        if why is None or block <= call.ll_max_bytes:
            return why
        return (f"its buffers take blocks (the bytes a rank sends each rank) of up to "
                f"{call.ll_max_bytes} bytes and this call's are {block} "
                f"({call.signature.nbytes} bytes over {call.size} ranks); use algo='auto', "
                "or another algorithm for calls this large")
