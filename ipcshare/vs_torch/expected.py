"""What every call of ``ipcshare vs-torch`` must leave: each rank's input values and the
exact output of one call or of a graph of calls, as periodic segments (small integers,
exact in every dtype and summation order), computed on the host."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .plan import DTYPES, MOVED, SizePlan

__all__ = ["PERIOD", "MAX_RANKS", "Segment", "rolled", "materialize", "rank_table",
           "sum_table", "input_segments", "expected_segments", "compounding_tolerance",
           "graph_expected"]

# Values repeat every PERIOD elements: a prime, so no block of a power-of-two size lines
# up with it and a block delivered to the wrong place holds other values.
PERIOD = 251
# Reductions use values in -8..8 and sums within 16 * 8 + 8 of zero: exact in bfloat16
# (integers to 256) at every partial sum of any order, up to this many ranks.
MAX_RANKS = 16
# The all-reduce's sums per element, repeating: zero or a signed power of two, so that
# in-place all-reduces compounded by a graph stay exact on a power-of-two world.
_TARGETS = (0, 1, -1, 2, -2, 4, -4)


@dataclasses.dataclass(frozen=True)
class Segment:
    """``length`` elements of ``table`` repeated, starting at its element ``offset``
    (modulo PERIOD)."""

    table: np.ndarray
    offset: int
    length: int


def rolled(segment: Segment) -> np.ndarray:
    """One period of ``segment`` as it starts (float64): its elements are this, tiled."""
    return np.roll(np.asarray(segment.table, dtype=np.float64), -(segment.offset % PERIOD))


def materialize(segments: Sequence[Segment]) -> np.ndarray:
    """The segments' elements one after the other (float64), on the host."""
    parts = [np.tile(rolled(s), -(-s.length // PERIOD))[:s.length] for s in segments]
    return np.concatenate(parts) if parts else np.zeros(0)


def rank_table(op: str, rank: int, world: int) -> np.ndarray:
    """One period of rank ``rank``'s input for ``op`` (int64): element i of its input is
    ``table[i % PERIOD]``. Moved ops: -125..125, a pattern of its own per rank.
    Reduce-scatter: -8..8. All-reduce: -8..8 on every rank but the last, whose values
    make each element's sum zero or a signed power of two (at most 16 * 8 + 4 from zero)."""
    i = np.arange(PERIOD, dtype=np.int64)
    if op in MOVED:
        return (i * 7 + rank * 13) % 251 - 125
    small = (i * 7 + rank * 13) % 17 - 8
    if op != "all_reduce" or rank != world - 1:
        return small
    others = sum((rank_table(op, r, world) for r in range(world - 1)),
                 np.zeros(PERIOD, dtype=np.int64))
    return sum_table(op, world) - others


def sum_table(op: str, world: int) -> np.ndarray:
    """One period of what a reduction of every rank's input leaves per element (int64)."""
    if op == "all_reduce":
        return np.asarray(_TARGETS, dtype=np.int64)[np.arange(PERIOD) * 3 % len(_TARGETS)]
    return sum((rank_table(op, r, world) for r in range(world)),
               np.zeros(PERIOD, dtype=np.int64))


def input_segments(plan: SizePlan, rank: int, world: int) -> list[Segment]:
    """What rank ``rank`` puts in its input before a checked call."""
    return [Segment(rank_table(plan.op, rank, world), 0, plan.in_count)]


def expected_segments(plan: SizePlan, rank: int, world: int) -> list[Segment]:
    """What one call leaves in rank ``rank``'s output."""
    if plan.op == "all_reduce":
        return [Segment(sum_table(plan.op, world), 0, plan.out_count)]
    if plan.op == "reduce_scatter":
        return [Segment(sum_table(plan.op, world), rank * plan.block, plan.block)]
    # Moved: block q comes from rank q; for all-to-all it is rank q's block ``rank``.
    start = 0 if plan.op == "all_gather" else rank * plan.block
    return [Segment(rank_table(plan.op, q, world), start, plan.block) for q in range(world)]


def compounding_tolerance(world: int, calls: int, bits: int) -> float:
    """The relative error allowed after ``calls`` in-place all-reduces in a row: none
    after one, or where the world is a power of two (every partial sum of a signed power
    of two times at most ``world`` is exact); else one unit in the last place per hop of
    every call after the first (NCCL rounds each partial sum)."""
    if calls <= 1 or world & (world - 1) == 0:
        return 0.0
    return (calls - 1) * (world - 1) * 2.0 ** (1 - bits)


def graph_expected(plan: SizePlan, rank: int, world: int, calls: int,
                   dtype: str) -> tuple[list[Segment] | None, float]:
    """What a graph of ``calls`` calls leaves in rank ``rank``'s output (None: what one
    call leaves, ``expected_segments``), and the relative tolerance of the comparison
    (0: bit for bit). Out of place, each call leaves what one does; in-place all-reduces
    compound: each multiplies the sums by the world size (beyond the dtype's range:
    infinity of that sign)."""
    if plan.op != "all_reduce" or calls <= 1:
        return None, 0.0
    _itemsize, bits, largest = DTYPES[dtype]
    values = sum_table(plan.op, world).astype(np.float64) * float(world) ** (calls - 1)
    values = np.where(np.abs(values) > largest, np.copysign(np.inf, values), values)
    return ([Segment(values, 0, plan.out_count)],
            compounding_tolerance(world, calls, bits))
