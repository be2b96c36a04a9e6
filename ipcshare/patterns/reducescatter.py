"""nccl-tests' reduce-scatter, run by the library's ``Communicator.reduce_scatter``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .allgather import allgather_busbw_factor
from .base import SizePlan
from .collective_case import CommunicatorCase

__all__ = ["ReduceScatter"]


class ReduceScatter(CommunicatorCase):
    """``size`` is the bytes of each rank's input (``n`` outputs); busbw = algbw(n-1)/n,
    the all-gather's factor."""

    name = "reducescatter"
    collective = "reduce_scatter"

    def plan(self, size: int, world_size: int, element_size: int) -> SizePlan:
        per_rank = max(1, size // (world_size * element_size))
        total = per_rank * world_size * element_size
        return SizePlan(size=total, count=per_rank * world_size, block_bytes=total,
                        element_size=element_size)

    def output_bytes(self, plan: SizePlan, world_size: int) -> int:
        return plan.size // world_size

    def in_place_offset(self, plan: SizePlan, rank: int, world_size: int) -> int:
        return rank * self.output_bytes(plan, world_size)

    def expected(self, reduced: np.ndarray, plan: SizePlan, rank: int,
                 world_size: int) -> np.ndarray:
        block = len(reduced) // world_size
        return reduced[rank * block:(rank + 1) * block]

    def call(self, communicator: Any, inputs: Any, output: Any, *, in_place: bool,
             stream: Any) -> Callable[[], None]:
        return communicator.bind("reduce_scatter", output, inputs, op=self.op,
                                 algo=self.library_algo, stream=stream)

    def bandwidth(self, plan: SizePlan, seconds: float, world_size: int) -> tuple[float, float]:
        algbw = plan.size / seconds / 1e9
        return algbw, algbw * allgather_busbw_factor(world_size)
