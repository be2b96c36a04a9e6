"""Custom collectives in Triton on ipcshare's memory: ``device_view`` describes a window,
a communicator's heap (``comm.empty()`` arrays) and registered arrays as one int64 table
a ``@triton.jit`` kernel takes, and the device functions (``translate``, ``load``,
``store``, ``get``, ``put``, ``atomic_*``, ``signal``, ``wait_until``, ``barrier_all``)
work on it. docs/API.md, "Triton kernels on shared memory", spells it out.

Importing this package imports neither Triton nor torch: the host side (building the
table, the refusals) needs neither; the device functions are loaded, with Triton, when a
kernel first names one.
"""

from __future__ import annotations

from typing import Any

from .table import FIRST_REGISTRATION_ROW, PAD_ROW, WINDOW_ROW, TableDescription, pack_table
from .view import MIN_TRITON, DeviceView, device_view, require_triton

_DEVICE_NAMES = ("CMP_EQ", "CMP_NE", "CMP_GT", "CMP_GE", "CMP_LT", "CMP_LE", "USER_WORD", "rank",
                 "world_size", "check_peer", "translate", "load", "store", "get", "put",
                 "atomic_add", "atomic_cas", "atomic_xchg", "pad", "signal", "release_fence",
                 "signal_relaxed", "wait_until", "barrier_all", "barrier_all_kernel")

__all__ = ["MIN_TRITON", "DeviceView", "device_view", "require_triton", "TableDescription",
           "pack_table", "PAD_ROW", "WINDOW_ROW", "FIRST_REGISTRATION_ROW", *_DEVICE_NAMES]


def __getattr__(name: str) -> Any:
    # The device functions import Triton: loaded on first use, after checking that the
    # installed Triton is new enough (one line when it is not).
    if name in _DEVICE_NAMES:
        require_triton()
        from . import device

        return getattr(device, name)
    raise AttributeError(f"module 'ipcshare.triton' has no attribute {name!r}")
