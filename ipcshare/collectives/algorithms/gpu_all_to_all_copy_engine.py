"""GPU all-to-all of even splits whose bytes move by copy engine: the copy
engines write over NVLink at rates the SMs' loads do not reach, ignore alignment, and
leave every SM to the user's kernels. No kernel moves a byte; two one-block kernels frame
the copies (kernels/src/collectives/copy_engine.cuh).

On the call's stream, with nothing on the host in between (so a CUDA graph captures a call
whole and replays it with whatever the arrays hold then):

1. ``publish_call``: the call's header (its digest, which step 4 compares), once every
   peer has finished its previous call: the copies of step 2 have no barrier before them,
   and a peer's previous call may still read its staging area 0 (a copy-engine call's
   inbox, a one-shot's staged input, a push call's inbox);
2. copies of block q of our input into slot ``rank`` of rank q's inbox (its staging area
   0, whose slots lie as the output's blocks do), for every q, the next rank first so that
   no rank is every sender's first target, our own block last (none in place, where it
   is in the output already);
3. a flag barrier (``meet(0)``): every block has landed in our inbox;
4. ``guard_all_to_all_output``: every rank's digest compared with ours (a disagreement
   goes into the error word, which ``synchronize()`` raises on every rank, since every
   rank compares every header); where they differ (a rank refused the call and carries a
   mark: collectives/call_marks.py), the inbox is first filled from our output, so step 5
   writes the output's own bytes back and no element moves;
5. local copies from the inbox into our output (adjacent copies merged: one copy where not
   in place);
6. ``finish_call``: the call's epoch published, after step 5, so the next copy-engine call
   of a peer, whose ``publish_call`` waits for that epoch, cannot write our inbox while we
   still read it;
7. a flag barrier (``meet(1)``): every rank has read its inbox, so no later call of any
   algorithm writes into one early; and every call meets on both sets of flag words, which
   keeps them alternating whatever calls follow (docs/MEMORY-ORDERING.md).

Why the inbox and never a peer's output, even where the peer's output is mapped here (its
heap, a registered array): a copy's addresses are fixed when the host enqueues it, and a
peer's output is known only to that peer's call (its header, on its GPU) and changes from
call to call. Writing it would cost a host round trip per call, which a graph cannot
replay. The inbox lies at a fixed place of every window, so one set of copies serves
every call and every replay, at the price of one local copy of what a rank receives (HBM
at several TB/s, against NVLink's hundreds of GB/s).

Sizes: the inbox is staging area 0, ``max_bytes`` and more (ScratchLayout.staging_bytes),
and an all-to-all's input is at most ``max_bytes`` (the communicator refuses larger ones
before any algorithm runs), so every call fits whole and none is cut into rounds.

In place: our input is read only by the copies of step 2, which end before the barrier;
the output is written from the inbox only after it. No peer reads our input or output, so
nothing is staged, any output may be the input, and inputs from ``empty()`` or registered
arrays cost nothing more.

Ranks that disagree: the copies into the inboxes run whatever the ranks' calls are (they
stay inside the areas, which are as large as the largest call); the guard of step 4 then
keeps every output as it was (in place, the input too), and every rank raises at
``synchronize()``. Our own block goes through the inbox for that reason: a copy from the
input straight into the output could not be called off. A peer
making a call of another family (a kernel that meets with block barriers) is met only as
a timeout, as for the copy-engine all-reduce.

Every call costs three kernel launches, two flag barriers and up to three batches of copies,
so it is meant for large calls; ``auto`` does not pick it until a run on several GPUs says
from which size it wins (choice.py).
"""

from __future__ import annotations

from typing import NamedTuple

from .gpu_copy_engine import GUARD_BLOCKS, merged_copies
from .gpu_kernel import GpuCall, GpuKernelAlgorithm

__all__ = ["CopyPlan", "GpuCopyEngineAllToAll", "copy_plan"]

Copy = tuple[int, int, int]  # (dst, src, nbytes), device addresses as mapped here


class CopyPlan(NamedTuple):
    """One rank's copies of a call: ``sends`` before the first barrier (our blocks into
    the peers' inboxes, and our own block into our output), ``receives`` after it (the
    peers' blocks from our inbox into our output)."""

    sends: list[Copy]
    receives: list[Copy]


def copy_plan(rank: int, size: int, count: int, itemsize: int, *, input: int, output: int,
              inboxes: list[int]) -> CopyPlan:
    """The copies rank ``rank`` of ``size`` makes for an all-to-all of ``count`` elements
    of ``itemsize`` bytes (``count`` a multiple of ``size``: block q of the input goes to
    rank q) from ``input`` into ``output``, where ``inboxes[q]`` is rank q's inbox (its
    window's staging area 0) as mapped here. Slot r of an inbox is where rank r's block
    lands, at r blocks from its start, as block r lies in the output. Our own block goes
    through our inbox too (the guard can keep the output only where every copy into it
    reads the inbox), but not in place, where it is in the output already."""
    block = count // max(size, 1) * itemsize
    if not block:
        return CopyPlan([], [])
    sends = [(inboxes[peer] + rank * block, input + peer * block, block)
             for peer in ((rank + step) % size for step in range(1, size))]
    if input != output:
        sends.append((inboxes[rank] + rank * block, input + rank * block, block))
    inbox = inboxes[rank]
    receives = merged_copies([(output + peer * block, inbox + peer * block, block)
                              for peer in range(size) if peer != rank or input != output])
    return CopyPlan(sends, receives)


class GpuCopyEngineAllToAll(GpuKernelAlgorithm):
    """Any dtype (bytes move), even splits only (a copy's size is fixed when it is
    enqueued, and all-to-all-v's counts may be known only on the GPU). Nothing is staged
    and any output may be the input (the module's docstring says why)."""

    name = "copy-engine"
    op = "all_to_all"
    aliasing_safe = True
    stages_input = False

    def run(self, call: GpuCall) -> None:
        args, signature, size = call.args, call.signature, call.size
        # ctypes reads a null pointer (an empty tensor's) as None.
        plan = copy_plan(int(args.rank), size, signature.count, signature.itemsize,
                         input=args.input or 0, output=args.output or 0,
                         inboxes=[args.windows[peer] + args.staging_offset[0]
                                  for peer in range(size)])
        call.launch("publish_call", 1)
        if plan.sends:
            call.copy(plan.sends)
        call.meet(0)
        call.launch("guard_all_to_all_output", GUARD_BLOCKS)
        if plan.receives:
            call.copy(plan.receives)
        call.launch("finish_call", 1)
        call.meet(1)
