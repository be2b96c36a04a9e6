"""The baselines by name: which class times each, and the one place that opens them."""

from __future__ import annotations

from typing import Any

from ..runtime.errors import ConfigError
from ..topology.world import World
from ..window import Group

__all__ = ["GPU_BASELINES", "gpu_baseline_class", "open_gpu_baseline", "mpi_baseline",
           "make_baseline"]

# name -> (module, class) of the baselines that time GPU memory.
_GPU_CLASSES = {
    "nccl": ("baseline_nccl4py", "Nccl4pyBaseline"),
    "torch": ("baseline_torch", "TorchBaseline"),
    "torch-symm": ("baseline_torch_symm", "TorchSymmBaseline"),
}
GPU_BASELINES = tuple(_GPU_CLASSES)


def gpu_baseline_class(name: str) -> Any:
    """The class of GPU baseline ``name`` (imported now: nothing heavy at import time).

    Raises:
        KeyError: not a GPU baseline.
    """
    import importlib

    module, cls = _GPU_CLASSES[name]
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)


def open_gpu_baseline(name: str, group: Group, pattern: Any) -> Any:
    """Collective: GPU baseline ``name`` timing ``pattern`` on ``group``'s GPUs.

    Raises:
        ConfigError: it cannot run here (on every rank, naming what is missing).
    """
    device = group.backend.device if group.backend.device_memory else None
    return gpu_baseline_class(name)(group.world, pattern, device)


def mpi_baseline(world: World, pattern: Any) -> Any:
    """The MPI baseline of ``pattern``: MpiBaseline for all-gather and ring, the
    reduction baseline for all-reduce and reduce-scatter, the all-to-all baseline for
    all-to-all.

    Raises:
        ConfigError: a datatype MPI cannot reduce.
    """
    if pattern.name in ("allreduce", "reducescatter"):
        from .baseline_mpi_reduce import MpiReductionBaseline

        return MpiReductionBaseline(world, pattern)
    if pattern.name == "alltoall":
        from .baseline_mpi_alltoall import MpiAllToAllBaseline

        return MpiAllToAllBaseline(world, pattern)
    from .baseline_mpi import MpiBaseline

    return MpiBaseline(world, pattern.name)


def make_baseline(name: str, group: Group, pattern: Any) -> Any:
    """Collective: the baseline ``name`` (``none`` gives None) for ``pattern``.

    Raises:
        ConfigError: it cannot time ``pattern`` here, or a GPU baseline of all-to-all (not
            built yet), on every rank.
    """
    if name == "none":
        return None
    if name == "mpi":
        return mpi_baseline(group.world, pattern)
    if pattern.name == "alltoall":
        raise ConfigError(f"--baseline {name} does not time all-to-all yet (issue 37): use "
                          "--baseline mpi or none")
    return open_gpu_baseline(name, group, pattern)
