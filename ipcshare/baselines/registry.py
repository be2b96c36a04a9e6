"""The baselines by name: which class times each, and the one place that opens them."""

from __future__ import annotations

from typing import Any

from ..topology.world import World
from ..window import Group

__all__ = ["GPU_BASELINES", "gpu_baseline_class", "open_gpu_baseline", "mpi_baseline",
           "make_baseline"]

# name -> (module, class) of the baselines that time GPU memory.
_GPU_CLASSES = {
    "nccl": ("nccl4py", "Nccl4pyBaseline"),
    "torch": ("torch_distributed", "TorchBaseline"),
    "torch-symm": ("torch_symm", "TorchSymmBaseline"),
}
# The baselines whose all-to-all is a class of its own: PyTorch symmetric memory's
# all_to_all_vdev runs on another backend of it (NVSHMEM) than its all-reduce kernels.
_ALL_TO_ALL_CLASSES = {
    "torch-symm": ("torch_symm_alltoall", "TorchSymmAllToAllBaseline"),
}
GPU_BASELINES = tuple(_GPU_CLASSES)


def gpu_baseline_class(name: str, op: str | None = None) -> Any:
    """The class of GPU baseline ``name``, of the one that times ``op`` where that is
    another (imported now: nothing heavy at import time).

    Raises:
        KeyError: not a GPU baseline.
    """
    import importlib

    module, cls = (_ALL_TO_ALL_CLASSES[name] if op == "alltoall" and name in _ALL_TO_ALL_CLASSES
                   else _GPU_CLASSES[name])
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)


def open_gpu_baseline(name: str, group: Group, pattern: Any) -> Any:
    """Collective: GPU baseline ``name`` timing ``pattern`` on ``group``'s GPUs.

    Raises:
        ConfigError: it cannot run here (on every rank, naming what is missing).
    """
    device = group.backend.device if group.backend.device_memory else None
    return gpu_baseline_class(name, pattern.name)(group.world, pattern, device)


def mpi_baseline(world: World, pattern: Any) -> Any:
    """The MPI baseline of ``pattern``: MpiBaseline for all-gather and ring, the
    reduction baseline for all-reduce and reduce-scatter, the all-to-all baseline for
    all-to-all.

    Raises:
        ConfigError: a datatype MPI cannot reduce.
    """
    if pattern.name in ("allreduce", "reducescatter"):
        from .mpi_reduce import MpiReductionBaseline

        return MpiReductionBaseline(world, pattern)
    if pattern.name == "alltoall":
        from .mpi_alltoall import MpiAllToAllBaseline

        return MpiAllToAllBaseline(world, pattern)
    from .mpi import MpiBaseline

    return MpiBaseline(world, pattern.name)


def make_baseline(name: str, group: Group, pattern: Any) -> Any:
    """Collective: the baseline ``name`` (``none`` gives None) for ``pattern``.

    Raises:
        ConfigError: it cannot time ``pattern`` here, on every rank.
    """
    if name == "none":
        return None
    if name == "mpi":
        return mpi_baseline(group.world, pattern)
    return open_gpu_baseline(name, group, pattern)
