"""GPU all-to-all-v, eager (kernels/src/collectives/all_to_all_v_eager.cuh): the push
all-to-all-v's stores without its meeting. Each receiver's inbox is cut into one slot per
peer, so a sender knows where its bytes go from its own counts alone and stores its first
tile as soon as the ranks' digests say every peer makes this call; the split rows travel
as LL lines beside the digests, as the LL all-to-all-v's do, and every rank checks them
all before any byte moves. The receiver copies each sender's tiles from its slot into its
output where the rows put them.

A slot holds the communicator's max_bytes over the ranks but one (at 2 ranks all of it,
so any call fits): a segment larger is found by every rank in the rows
(kSplitTooLargeForSlot), and synchronize() raises it on every rank, no byte moved.
``auto`` does not pick it: on two H200s it was the fastest only at random splits of
32 MiB, and ``auto`` cannot tell random splits from skewed ones on the host
(docs/COLLECTIVES.md, "eager")."""

from __future__ import annotations

from typing import Any

from .gpu_all_to_all_push import GpuPushAllToAllV
from .gpu_kernel import GpuKernelAlgorithm

__all__ = ["GpuEagerAllToAllV"]


class GpuEagerAllToAllV(GpuPushAllToAllV):
    """Push's grid (from max_bytes: every rank cuts every sender's parts alike) and
    tiles; nothing is refused on the host for the counts, which may be on the GPU."""

    name = "eager"
    kernel = "all_to_all_v_eager_bytes"

    def unsupported(self, call: Any) -> str | None:
        return GpuKernelAlgorithm.unsupported(self, call)
