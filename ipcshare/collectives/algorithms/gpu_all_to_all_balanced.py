"""GPU all-to-all and all-to-all-v, balanced (kernels/src/collectives/all_to_all_balanced.cuh):
the pull kernel's one-kernel protocol with the work cut by bytes instead of by peer, and
copies at full width whatever the alignment.

Each rank's blocks cut the bytes it sends, and the bytes it receives, into as many equal
runs of 16-byte granules as there are blocks (all_to_all_plan.cuh): block b stages run b
of what it sends (never its own segment, which it copies from its input into its output
directly) and signals it; block b of a receiver copies run b of what it receives, waiting
only for the senders' runs that hold it. A skewed call keeps every block busy on the hot
receiver, a zero segment costs nothing, and no block waits for a peer's whole staging.
Copies use 16-byte stores, fed by aligned loads shifted into place where source and
destination are not aligned alike (kernels/include/ipcshare/wide_copy.cuh).

Everything pull keeps is kept: device splits read at run time, ``output_splits`` filled on
the device, the same split checks on every rank with nothing moved, graphs replayed with
new splits, inputs from ``empty()`` and registered arrays read in place. ``auto`` runs
it for the all-to-all-v of communicators whose max_bytes passes ll's reach (2 MiB at 2
ranks, 512 KiB at more), and for all-to-alls above 8 MiB, but above 32 MiB at 2 ranks,
where push runs them (choice.py has the figures)."""

from __future__ import annotations

from .gpu_all_to_all import GpuPullAllToAll, GpuPullAllToAllV

__all__ = ["GpuBalancedAllToAll", "GpuBalancedAllToAllV"]


class GpuBalancedAllToAll(GpuPullAllToAll):
    """Any dtype (bytes move). In place, a block overwrites input bytes only after this
    rank's blocks that stage them have signalled; an input peers read in place is staged
    first when in place (aliasing_safe False), as for pull."""

    name = "balanced"
    kernel = "all_to_all_balanced_bytes"


class GpuBalancedAllToAllV(GpuPullAllToAllV):
    """The grid follows the communicator's ``max_bytes`` (every rank must cut the same
    runs, and the counts may only be known on the GPU), as for pull."""

    name = "balanced"
    kernel = "all_to_all_v_balanced_bytes"
