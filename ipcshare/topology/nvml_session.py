"""NVML (through nvidia-ml-py, optional) opened for one question and closed again, and
a GPU's NVML handle found by the PCI address CUDA gives."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["nvml_session", "handle_by_cuda_bus_id"]


@contextlib.contextmanager
def nvml_session() -> Iterator[Any]:
    """``pynvml`` initialised for the with-block, or None when nvidia-ml-py is absent
    or NVML cannot start (no library, no driver). Shut down on the way out; nothing
    NVML says on shutdown escapes."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except Exception:  # no NVML library, or no driver
        yield None
        return
    try:
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def handle_by_cuda_bus_id(pynvml: Any, bus_id: str) -> Any:
    """The NVML handle of the GPU at ``bus_id`` as CUDA spells it (``0000:1B:00.0``;
    NVML wants an eight-digit domain).

    Raises:
        pynvml.NVMLError: NVML knows no such GPU.
        ValueError: not a ``domain:bus:device.function`` address.
    """
    domain, _, rest = bus_id.strip().partition(":")
    nvml_id = f"{int(domain, 16):08x}:{rest}"
    return pynvml.nvmlDeviceGetHandleByPciBusId(nvml_id.upper().encode())
