"""Host all-gather: every rank copies every rank's block into its own output."""

from __future__ import annotations

from .base import Algorithm, HostCall

__all__ = ["HostCopyAllGather"]


class HostCopyAllGather(Algorithm):
    """Pull: each rank reads every peer's input (in the peer's window) straight into its
    output, starting with the next rank so peers spread their reads. Outputs need not
    be in a window. One barrier before (the path's) and, when some input is the user's
    own memory, one after."""

    name = "copy-engine"
    op = "all_gather"
    memory = "host"

    def run(self, call: HostCall) -> None:
        block = call.count * call.itemsize
        for step in range(call.size):
            rank = (call.rank + step) % call.size
            if rank == call.rank and call.in_place:
                continue  # our block is already in its slot
            call.output[rank * block:(rank + 1) * block] = call.inputs[rank]
        if call.hold_inputs:
            call.barrier()  # nobody still reads an input its owner may now overwrite
