"""Several ranks on one GPU: what ipcshare does about it and what to tell the user.

Without MPS the CUDA contexts of different processes on one GPU do not run side by side:
the GPU gives them turns in time slices. Any wait on the GPU for a peer that shares it
(a stream waiting on a flag, a kernel spinning on one) can then last a whole time slice,
milliseconds instead of microseconds (docs/GPU.md, "Several ranks on one GPU").
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..runtime.gpu_names import format_uuid
from .world import format_ranks

__all__ = ["GpuSharing", "gpu_sharing", "shared_gpus_advice"]


class GpuSharing(NamedTuple):
    """``shared``: ``{GPU uuid: the ranks on it}`` for GPUs several ranks use;
    ``time_sliced``: those of them where some rank is not an MPS client, whose contexts
    take turns."""

    shared: dict[Any, list[int]]
    time_sliced: dict[Any, list[int]]


def gpu_sharing(ranks: list[int], devices: list[tuple[Any, bool]]) -> GpuSharing:
    """Which GPUs the ``ranks`` of a node share, from each one's ``(GPU uuid, served by
    MPS)`` in the same order (uuid None: no GPU). The same answer on every rank that
    gathered the same list."""
    uuids = [uuid for uuid, _mps in devices]
    shared = {uuid: [rank for rank, other in zip(ranks, uuids, strict=True) if other == uuid]
              for uuid in dict.fromkeys(uuids) if uuid is not None and uuids.count(uuid) > 1}
    time_sliced = {uuid: on_it for uuid, on_it in shared.items()
                   if not all(mps for other, mps in devices if other == uuid)}
    return GpuSharing(shared, time_sliced)


def shared_gpus_advice(shared: dict[Any, list[int]],
                       time_sliced: dict[Any, list[int]] | None = None) -> str:
    """One line on the GPUs that several ranks use (``{uuid: [world ranks]}``): what
    ipcshare does about it, then (after "; give ") what the user can do. ``time_sliced``
    names those of them not served by MPS (None: not known, so all of them)."""
    if time_sliced is None:
        time_sliced = shared
    if not time_sliced:
        who = "; ".join(f"{format_ranks(ranks)} on GPU {format_uuid(uuid)}"
                        for uuid, ranks in shared.items())
        return (f"GPUs shared by several ranks ({who}) run them side by side under MPS: "
                "barriers, all-gathers and communicators use their usual kernels, as on "
                "GPUs of their own (the ranks share the GPU's bandwidth)")
    who = "; ".join(f"{format_ranks(ranks)} on GPU {format_uuid(uuid)}"
                    for uuid, ranks in time_sliced.items())
    return (f"GPUs shared by several ranks ({who}): without MPS their contexts take turns in "
            "time slices, so barriers meet on the host, auto all-gathers with one rank per "
            "GPU and communicators run stepped kernels, the lowest rank of each such GPU "
            "for all its ranks (their own tensors mapped after a few calls); give "
            "each rank its own GPU, or start MPS (nvidia-cuda-mps-control -d) to run them "
            "side by side")
