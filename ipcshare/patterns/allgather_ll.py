"""All-gather by the collectives layer's low-latency protocol (``Communicator.all_gather``
with ``algo="ll"``): the driver's all-gather window, data and checks, with the bytes moved
by one kernel that pushes lines carrying their own arrival flags (docs/COLLECTIVES.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backends.device_buffer import DeviceArray
from ..runtime.errors import ConfigError
from ..window import Window
from .allgather import AllGather
from .base import SizePlan
from .collective_case import communicator_for

__all__ = ["LowLatencyAllGather"]


def _bytes_array(buffer: Any) -> DeviceArray:
    return DeviceArray(buffer.ptr, buffer.nbytes, buffer.device, buffer, (buffer.nbytes,),
                       "uint8")


class LowLatencyAllGather(AllGather):
    """``--algo ll``: GPU backends, one node, each rank's block within the LL buffers."""

    def __init__(self) -> None:
        super().__init__("ll")
        self._communicator: Any = None  # the window's group closes it

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        if not window.backend.has_kernels:
            raise ConfigError("--algo ll runs GPU kernels: it needs a GPU backend (cuda-ipc "
                              "or cuda-vmm), not host")
        communicator = self._communicator = communicator_for(
            self._communicator, window, plan.block_bytes * window.world_size)
        source = _bytes_array(self._send_of(window, window.rank, plan, mode))
        output = _bytes_array(window.local.slice(self._recv_offset(plan),
                                                 plan.block_bytes * window.world_size))
        return communicator.bind("all_gather", output, source, algo="ll",
                                 stream=window.engine.stream)

    def check(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> int:
        if self._communicator is not None:
            # A kernel that gave up, or ranks that disagreed, raise here with the cause.
            self._communicator.synchronize(window.engine.stream)
        return super().check(window, plan, mode, iteration)
