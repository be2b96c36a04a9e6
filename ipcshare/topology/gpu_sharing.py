"""Several ranks on one GPU: what ipcshare does about it and what to tell the user.

Without MPS the CUDA contexts of different processes on one GPU do not run side by side:
the GPU gives them turns in time slices. Any wait on the GPU for a peer that shares it
(a stream waiting on a flag, a kernel spinning on one) can then last a whole time slice,
milliseconds instead of microseconds (docs/GPU.md, "Several ranks on one GPU").
"""

from __future__ import annotations

from typing import Any

from .world import format_ranks

__all__ = ["shared_gpus_advice"]


def shared_gpus_advice(shared: dict[Any, list[int]],
                       time_sliced: dict[Any, list[int]] | None = None) -> str:
    """One line on the GPUs that several ranks use (``{uuid: [world ranks]}``): what
    ipcshare does about it, then (after "; give ") what the user can do. ``time_sliced``
    names those of them not served by MPS (None: not known, so all of them)."""
    if time_sliced is None:
        time_sliced = shared
    if not time_sliced:
        who = "; ".join(f"{format_ranks(ranks)} on GPU {_short_uuid(uuid)}"
                        for uuid, ranks in shared.items())
        return (f"GPUs shared by several ranks ({who}) run them side by side under MPS: "
                "communicators use their usual kernels, while barriers still meet on the "
                "host and auto all-gathers with one rank per GPU")
    who = "; ".join(f"{format_ranks(ranks)} on GPU {_short_uuid(uuid)}"
                    for uuid, ranks in time_sliced.items())
    return (f"GPUs shared by several ranks ({who}): without MPS their contexts take turns in "
            "time slices, so barriers meet on the host, auto uses the copy engine and "
            "communicators run stepped kernels that never spin; give "
            "each rank its own GPU, or start MPS (nvidia-cuda-mps-control -d) to run them "
            "side by side")


def _short_uuid(uuid: Any) -> str:
    text = uuid.hex() if isinstance(uuid, bytes) else str(uuid)
    return text.removeprefix("GPU-")[:8]
