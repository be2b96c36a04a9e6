"""GPU stepped collectives, for ranks that share a GPU: the one-shot all-reduce and
reduce-scatter and the pull all-gather, cut where their kernels would spin.

Without MPS the CUDA contexts on one GPU take turns in time slices, so a kernel that
spins on a peer's flag keeps the GPU from the very peer that must raise it: 2,280 us per
400 KB all-reduce with 2 ranks on one H100 (docs/GPU.md). A stepped call is four steps on
its stream and nothing spins:

1. a kernel stages the input (unless peers read it in place) and publishes the header;
2. the stream meets the peers with stream memory operations (``call.meet(0)``): the GPU's
   front end waits for the flags, and the other contexts get the GPU meanwhile;
3. a kernel reads the headers and does the collective (the one-shot kernel's work);
4. the stream meets the peers again on the other set of flag words (``call.meet(1)``),
   so no rank goes on while a peer may still read its input.

The meetings use fixed values only, so a CUDA graph captures a call whole and replays it
correctly; each call uses both sets of words, so any number of calls may follow each
other. ``auto`` picks these where the group has ranks sharing a GPU (choice.py).
"""

from __future__ import annotations

from ..agreement import Signature
from .gpu_kernel import GpuCall, GpuKernelAlgorithm
from .gpu_one_shot import GpuOneShotAllReduce, GpuOneShotReduceScatter
from .gpu_pull_all_gather import GpuPullAllGather

__all__ = ["GpuSteppedAllGather", "GpuSteppedAllReduce", "GpuSteppedReduceScatter"]

# Input bytes each block of the staging kernel copies.
_STAGE_BYTES_PER_BLOCK = 16 << 10


class _Stepped(GpuKernelAlgorithm):
    leader_runs_time_sliced = True

    def stage_entry(self, signature: Signature) -> str:
        kind = "bytes" if signature.op == "all_gather" else signature.dtype
        return f"stage_and_publish_{kind}"

    def run(self, call: GpuCall) -> None:
        shared = call.time_sliced
        if shared is not None and shared.guest:
            shared.hand_over()  # the leader of our GPU runs the steps below for us
            return
        signature = call.signature
        stage_blocks = max(1, min(call.max_blocks,
                                   -(-signature.nbytes // _STAGE_BYTES_PER_BLOCK)))
        launch, meet = (call.launch, call.meet) if shared is None else (shared.launch,
                                                                        shared.meet)
        if shared is not None:
            shared.take_guests()
        launch(self.stage_entry(signature), stage_blocks)
        meet(0)
        launch(self.entry(signature), self.blocks(signature, call.size, call.max_blocks))
        meet(1)
        if shared is not None:
            shared.release_guests()


# Each is its unstepped twin (same slices, same aliasing rules) with other entry points.
class GpuSteppedAllReduce(_Stepped, GpuOneShotAllReduce):
    name = "stepped"
    kernel = "all_reduce_stepped"


class GpuSteppedReduceScatter(_Stepped, GpuOneShotReduceScatter):
    name = "stepped"
    kernel = "reduce_scatter_stepped"


class GpuSteppedAllGather(_Stepped, GpuPullAllGather):
    name = "stepped"
    kernel = "all_gather_stepped_bytes"
