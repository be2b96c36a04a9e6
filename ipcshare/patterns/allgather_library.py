"""All-gather by one of the collectives layer's GPU algorithms (``Communicator.all_gather``
with ``algo=``): the driver's all-gather window, data and checks, with the bytes moved by
the library. ``--algo ll``: one kernel that pushes lines carrying their own arrival flags
(docs/COLLECTIVES.md), ``--algo ll128`` the same with 128-byte lines; ``--algo stepped``:
two kernels with the stream's own barriers between them, none of them spinning (for ranks
sharing a GPU; docs/GPU.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backends.device_buffer import DeviceArray
from ..runtime.errors import ConfigError
from ..window import Window
from .allgather import AllGather
from .base import SizePlan
from .collective_case import communicator_for

__all__ = ["LibraryAllGather"]


def _bytes_array(buffer: Any) -> DeviceArray:
    return DeviceArray(buffer.ptr, buffer.nbytes, buffer.device, buffer, (buffer.nbytes,),
                       "uint8")


class LibraryAllGather(AllGather):
    warm_before_capture = True
    """``--algo ll`` or ``ll128`` (each rank's block within the LL buffers) or ``--algo
    stepped``: GPU backends, one node."""

    def __init__(self, algo: str) -> None:
        super().__init__(algo)
        self._communicator: Any = None  # the window's group closes it

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        if not window.backend.has_kernels:
            raise ConfigError(f"--algo {self.algo} runs GPU kernels: it needs a GPU backend "
                              "(cuda-ipc or cuda-vmm), not host")
        communicator = self._communicator = communicator_for(
            self._communicator, window, plan.block_bytes * window.world_size)
        source = _bytes_array(self._send_of(window, window.rank, plan, mode))
        output = _bytes_array(window.local.slice(self._recv_offset(plan),
                                                 plan.block_bytes * window.world_size))
        return communicator.bind("all_gather", output, source, algo=self.algo,
                                 stream=window.engine.stream)

    def check(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> int:
        if self._communicator is not None:
            # A kernel that gave up, or ranks that disagreed, raise here with the cause.
            self._communicator.synchronize(window.engine.stream)
        return super().check(window, plan, mode, iteration)
