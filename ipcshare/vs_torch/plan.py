"""What each row of ``ipcshare vs-torch`` runs: the ops and the calls compared, the
dtypes, the options, and the sizes as nccl-tests counts them (with their busbw)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..patterns.allgather import allgather_busbw_factor
from ..patterns.allreduce import allreduce_busbw_factor

__all__ = ["OPS", "CALLS", "MOVED", "SIDES", "MODES", "DTYPES", "Options", "SizePlan",
           "size_plan", "sweep", "communicator_bytes", "busbw"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
CALLS = {
    "all_reduce": ("comm.all_reduce(t, stream=s)", "dist.all_reduce(t)"),
    "all_gather": ("comm.all_gather(out, t, stream=s)", "dist.all_gather_into_tensor(out, t)"),
    "reduce_scatter": ("comm.reduce_scatter(out, t, stream=s)",
                       "dist.reduce_scatter_tensor(out, t)"),
    "all_to_all": ("comm.all_to_all(out, t, stream=s)", "dist.all_to_all_single(out, t)"),
}
# Ops that move bytes (checked bit for bit) rather than reduce them.
MOVED = ("all_gather", "all_to_all")
SIDES = ("ours", "torch")
MODES = ("graph", "eager")
# itemsize, significand bits (with the implicit one), largest finite value.
DTYPES = {"bfloat16": (2, 8, 3.3895313892515355e38), "float16": (2, 11, 65504.0),
          "float32": (4, 24, 3.4028234663852886e38)}
_ROUND_BYTES = 64 << 10  # communicator sizes rounded as tests/sizing.py does


@dataclasses.dataclass(frozen=True)
class Options:
    """One run's options, checked (``cli/vs_torch.py`` builds them from the flags):
    sizes ``min_bytes`` to ``max_bytes`` by ``step_factor``, the tensors' ``dtype``,
    the ``ops`` in the order they run, ``calls`` per graph and eager stretch, graph
    ``replays``, eager ``warmup`` calls, ``host_calls`` timed on the host clock."""

    min_bytes: int = 8 << 10
    max_bytes: int = 256 << 20
    step_factor: int = 4
    dtype: str = "bfloat16"
    ops: tuple[str, ...] = OPS
    calls: int = 20
    replays: int = 10
    warmup: int = 5
    host_calls: int = 100


# -- sizes ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SizePlan:
    """One row: ``size`` bytes as nccl-tests counts them for ``op``, the element counts
    of each rank's input and output, and ``block`` (the elements one rank gives or gets:
    all-gather's input, reduce-scatter's output, an all-to-all block; all-reduce's
    whole tensor)."""

    op: str
    size: int
    in_count: int
    out_count: int
    block: int
    itemsize: int

    @property
    def largest_bytes(self) -> int:
        """Bytes of the larger of the call's two arrays."""
        return max(self.in_count, self.out_count) * self.itemsize


def size_plan(op: str, nbytes: int, world: int, itemsize: int) -> SizePlan | None:
    """The row of ``op`` for ``nbytes`` at ``world`` ranks, counts rounded down to whole
    blocks as nccl-tests does; None where not one element per rank is left.

    Raises:
        ValueError: an op not in OPS, or a world below 1.
    """
    if op not in OPS or world < 1:
        raise ValueError(f"op={op!r}, world={world}: expected one of {OPS} and 1 rank or more")
    elements = nbytes // itemsize
    if op == "all_reduce":
        return SizePlan(op, elements * itemsize, elements, elements, elements,
                        itemsize) if elements else None
    block = elements // world
    if block == 0:
        return None
    whole = block * world
    counts = {"all_gather": (block, whole), "reduce_scatter": (whole, block),
              "all_to_all": (whole, whole)}[op]
    return SizePlan(op, whole * itemsize, *counts, block, itemsize)


def sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """nccl-tests' sizes: min, min*f, ... up to max (one size for a factor below 2)."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        if factor < 2:
            break
        size *= factor
    return sizes


def communicator_bytes(plans: Sequence[SizePlan]) -> int:
    """``max_bytes`` for a communicator that takes every call of ``plans``: the largest
    array of any, rounded up to 64 KiB (as tests/sizing.py sizes a test's)."""
    largest = max((plan.largest_bytes for plan in plans), default=0)
    return max(-(-largest // _ROUND_BYTES), 1) * _ROUND_BYTES


def busbw(op: str, size: int, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth in GB/s of ``size`` bytes in ``seconds``: algbw times
    2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all."""
    factor = allreduce_busbw_factor(world) if op == "all_reduce" else (
        allgather_busbw_factor(world))
    return size / seconds / 1e9 * factor
