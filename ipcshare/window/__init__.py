"""Windows: a ``Group`` (world + backend + exchange) and its ``Window``s (one symmetric
buffer per rank, plus a signal pad, mapped in every process of the node), their layout,
barriers, views and the staged copies of pairs without peer access."""

from __future__ import annotations

from ..backends import resolve_backend_name
from .group import Group
from .layout import (
    BARRIER_SLOTS,
    DEVICE_BARRIER_SLOT_BASE,
    EPOCH_SLOT_BASE,
    ERROR_SLOT,
    FLAG_BARRIER_SLOT_BASE,
    KERNEL_SLOT_BASE,
    LL_EPOCH_SLOT,
    SIGNAL_PAD_BYTES,
    USER_SLOT_BASE,
    USER_SLOTS,
)
from .views import StreamWindow
from .window import Window

__all__ = ["Group", "Window", "StreamWindow", "SIGNAL_PAD_BYTES", "BARRIER_SLOTS",
           "USER_SLOT_BASE", "USER_SLOTS", "ERROR_SLOT", "KERNEL_SLOT_BASE",
           "DEVICE_BARRIER_SLOT_BASE", "EPOCH_SLOT_BASE", "FLAG_BARRIER_SLOT_BASE",
           "LL_EPOCH_SLOT", "resolve_backend_name"]
