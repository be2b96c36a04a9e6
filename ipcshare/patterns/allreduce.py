"""nccl-tests' all-reduce, run by the library's ``Communicator.all_reduce``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .base import SizePlan
from .collective_case import CommunicatorCase

__all__ = ["AllReduce", "allreduce_busbw_factor"]


def allreduce_busbw_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus factor 2(n-1)/n (1 for a world of one, as all-gather)."""
    return 2 * (world_size - 1) / world_size if world_size > 1 else 1.0


class AllReduce(CommunicatorCase):
    """``size`` is the bytes of each rank's array (input and output alike)."""

    name = "allreduce"
    collective = "all_reduce"

    def plan(self, size: int, world_size: int, element_size: int) -> SizePlan:
        count = max(1, size // element_size)
        return SizePlan(size=count * element_size, count=count,
                        block_bytes=count * element_size, element_size=element_size)

    def output_bytes(self, plan: SizePlan, world_size: int) -> int:
        return plan.size

    def in_place_offset(self, plan: SizePlan, rank: int, world_size: int) -> int:
        return 0

    def expected(self, reduced: np.ndarray, plan: SizePlan, rank: int,
                 world_size: int) -> np.ndarray:
        return reduced

    def call(self, communicator: Any, inputs: Any, output: Any, *, in_place: bool,
             stream: Any) -> Callable[[], None]:
        if in_place:  # the output is the input itself
            return communicator.bind("all_reduce", inputs, op=self.op, algo=self.library_algo,
                                     stream=stream)
        return communicator.bind("all_reduce", inputs, op=self.op, output=output,
                                 algo=self.library_algo, stream=stream)

    def bandwidth(self, plan: SizePlan, seconds: float, world_size: int) -> tuple[float, float]:
        algbw = plan.size / seconds / 1e9
        return algbw, algbw * allreduce_busbw_factor(world_size)
