"""GPU two-shot all-reduce whose bytes between GPUs move by copy engine: the copy engines
write over NVLink at rates the SMs' loads do not reach (the all-gather's copy engine
reached 322-384 GB/s on 2 H200s where the pull kernel read 240), and the reduction reads
only local memory.

On the call's stream, with nothing on the host in between (kernels/src/collectives/
copy_engine.cuh has the safety argument):

1. ``publish_call``: the call's header, so the reduction can compare digests, once every
   peer has finished its previous call (the copies of step 2 have no barrier before them,
   and a peer's previous call of another algorithm may still read its staging area 0);
2. copies of chunk q of our input into slot ``rank`` of rank q's inbox (its staging
   area 0), for every peer q;
3. a flag barrier (``meet(0)``);
4. the kernel: our chunk, reduced in rank order from our input and the inbox, into our
   output;
5. copies of that chunk into every peer's result area 0, at the chunk's place;
6. a flag barrier (``meet(1)``);
7. ``guard_all_reduce_output``: where the ranks' digests differ (a rank refused the call
   and carries a mark: collectives/call_marks.py), our result area is first filled from
   our output, so that step 8 writes the output's own bytes back and no element moves
   (the kernel of step 4 writes nothing then);
8. local copies of the other chunks from our result area into our output.

No peer reads our input or output, so any output may be the input (in place) and
nothing is staged. Every step's cost is fixed per call (about ten stream operations), so
it is meant for large calls; ``auto`` does not pick it until a run on several GPUs says
from which size it wins (choice.py).
"""

from __future__ import annotations

from .gpu_kernel import GpuCall
from .gpu_two_shot import GpuTwoShotAllReduce, chunk_elements, chunk_spans

__all__ = ["GUARD_BLOCKS", "GpuCopyEngineAllReduce", "merged_copies"]

# Blocks of the guards before a copy-engine call's last copies (copy_engine.cuh): each
# compares the digests (a few loads) and, only where the call failed, copies its share.
GUARD_BLOCKS = 8


class GpuCopyEngineAllReduce(GpuTwoShotAllReduce):
    """The two-shot's chunks and slices, its bytes between GPUs moved by copy engine."""

    name = "copy-engine"
    kernel = "all_reduce_copy_engine"
    stages_input = False

    def run(self, call: GpuCall) -> None:
        signature, args = call.signature, call.args
        me, size = int(args.rank), call.size
        spans = chunk_spans(signature.count, signature.itemsize, size)
        own_offset, own_bytes = spans[me]
        # Our slot in a peer's inbox: a full chunk per source rank.
        inbox_slot = me * chunk_elements(signature.count, signature.itemsize, size) \
            * signature.itemsize
        call.launch("publish_call", 1)
        call.copy([(args.windows[peer] + args.staging_offset[0] + inbox_slot,
                    args.input + offset, nbytes)
                   for peer, (offset, nbytes) in enumerate(spans) if peer != me and nbytes])
        call.meet(0)
        call.launch(self.entry(signature), self.blocks(signature, size, call.max_blocks))
        if own_bytes:
            call.copy([(args.windows[peer] + args.result_offset[0] + own_offset,
                        args.output + own_offset, own_bytes)
                       for peer in range(size) if peer != me])
        call.meet(1)
        call.launch("guard_all_reduce_output", GUARD_BLOCKS)
        result = args.windows[me] + args.result_offset[0]
        call.copy(merged_copies([(args.output + offset, result + offset, nbytes)
                           for peer, (offset, nbytes) in enumerate(spans)
                           if peer != me and nbytes]))


def merged_copies(jobs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Copies ``(dst, src, nbytes)`` of adjacent runs, each following the one before it in
    both source and destination, merged into one (the chunks before ours, and after)."""
    merged: list[tuple[int, int, int]] = []
    for dst, src, nbytes in jobs:
        if merged:
            last_dst, last_src, last_bytes = merged[-1]
            if last_dst + last_bytes == dst and last_src + last_bytes == src:
                merged[-1] = (last_dst, last_src, last_bytes + nbytes)
                continue
        merged.append((dst, src, nbytes))
    return merged
