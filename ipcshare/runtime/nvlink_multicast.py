"""NVLink SHARP / multicast stays off: it can take shared GPUs out of service (the design's rule),
so NCCL and PyTorch symmetric memory are told so before they start."""

from __future__ import annotations

import os

__all__ = ["keep_multicast_off"]


def keep_multicast_off() -> None:
    """Never multicast by default, for NCCL and for PyTorch symmetric memory alike; a
    value the user set wins."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
