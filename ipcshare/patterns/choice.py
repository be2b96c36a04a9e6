"""``--algo auto`` for all-gather on GPUs: which algorithm wins at which size, from a table
measured on the H200 nodes (docs/BENCHMARKS.md, "Choosing the algorithm"), not guessed.

Kernels that move bytes with loads and stores and synchronise through flags win while an
operation is short (the copy engine's per-copy launch and the stream memory operations
of its barriers cost more than the bytes); the copy engine wins once the bytes dominate,
since it reaches the link's rate without taking SMs from the user's kernels.
"""

from __future__ import annotations

import bisect
import dataclasses

__all__ = ["AllGatherChoice", "ALLGATHER_CHOICES", "choose_allgather"]


@dataclasses.dataclass(frozen=True)
class AllGatherChoice:
    """For ``world_size`` ranks: ``algos[i]`` runs sizes (total gathered bytes) up to and
    including ``limits[i]``; the last algorithm runs everything larger."""

    world_size: int
    limits: tuple[int, ...]
    algos: tuple[str, ...]

    def pick(self, size: int) -> str:
        return self.algos[bisect.bisect_left(self.limits, size)]


_MiB = 1 << 20
# Measured on nvidia-h200-x4 (see docs/BENCHMARKS.md for the run, date and commit): the
# fastest algorithm at each size of a 1 KiB - 1 GiB sweep, eager and graph timing.
ALLGATHER_CHOICES = {
    2: AllGatherChoice(2, (64 * _MiB,), ("pull", "copy-engine")),
    4: AllGatherChoice(4, (64 * _MiB,), ("push", "copy-engine")),
}


def choose_allgather(size: int, world_size: int) -> str:
    """The all-gather algorithm for ``size`` total bytes over ``world_size`` GPUs of one
    node: the measured table's row for the nearest world size at or below (8 ranks use
    the 4-rank row; kernels name at most 8 ranks, so more use the copy engine)."""
    if world_size < 2 or world_size > 8:
        return "copy-engine"
    known = max(n for n in ALLGATHER_CHOICES if n <= world_size)
    return ALLGATHER_CHOICES[known].pick(size)
