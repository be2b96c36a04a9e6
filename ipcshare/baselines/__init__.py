"""The baselines a run is timed against, one file per peer behind the driver's interface
(MPI, NCCL through nccl4py, NCCL through torch.distributed, PyTorch symmetric memory);
the registry (``make_baseline``) is the one place that opens them."""

from .registry import (
    GPU_BASELINES,
    gpu_baseline_class,
    make_baseline,
    mpi_baseline,
    open_gpu_baseline,
)

__all__ = ["GPU_BASELINES", "gpu_baseline_class", "open_gpu_baseline", "mpi_baseline",
           "make_baseline"]
