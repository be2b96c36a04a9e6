"""The two self-checks every timed row passes before it is printed or written: the timer
agrees with a second clock, and the bandwidth it implies is one the path can carry.

- Second clock: the host's time from the first enqueue to the moment every stream of
  the rank was seen finished (``Timer.wall_seconds``). A timer on a stream the work is
  not on, or a figure averaged wrongly over ranks, disagrees with it.
- Ceiling: the busbw of a row may not pass the rank's link or memory rate
  (topology/link_speed.py). busbw is what one rank's links carry per direction in
  nccl-tests' accounting (for all-reduce a lower bound of it), so it is held against
  the per-direction rate of one rank's links.

A row failing either is a measurement error: the table says so under the row, the
result document lists it, and the command exits non-zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..topology.link_speed import Ceiling
from .timing import percentile

__all__ = ["CLOCK_TOLERANCE", "CLOCK_SLACK_S", "clock_disagreement",
           "latency_clock_disagreement", "ceiling_error", "agreed_errors"]

# The two clocks may differ by this fraction of the host clock plus CLOCK_SLACK_S: the
# host clock also holds the first launch before the start event fires and the moment
# the finish is seen (a cuCtxSynchronize), a few µs each on an H100 / H200.
CLOCK_TOLERANCE = 0.10
CLOCK_SLACK_S = 20e-6


def clock_disagreement(timer_s: float, wall_s: float | None, what: str) -> str | None:
    """None when ``timer_s`` (the timer's seconds for a timed stretch) agrees with
    ``wall_s`` (the host clock over the same stretch), else the error in words. No
    second clock (None) is no disagreement."""
    if wall_s is None:
        return None
    if abs(timer_s - wall_s) <= CLOCK_TOLERANCE * wall_s + CLOCK_SLACK_S:
        return None
    return (f"{what}: the timer gave {timer_s * 1e6:.2f} us but the host clock from the first "
            f"enqueue to a full synchronize {wall_s * 1e6:.2f} us (allowed: "
            f"{CLOCK_TOLERANCE:.0%} + {CLOCK_SLACK_S * 1e6:g} us)")


def latency_clock_disagreement(timer_samples: Sequence[float],
                               wall_samples: Sequence[float], what: str) -> str | None:
    """``clock_disagreement`` of the medians of per-sample readings."""
    if not timer_samples or not wall_samples:
        return None
    return clock_disagreement(percentile(timer_samples, 50), percentile(wall_samples, 50),
                              f"{what} (median sample)")


def ceiling_error(busbw: float, ceiling: Ceiling | None, what: str) -> str | None:
    """None when ``busbw`` (GB/s) is within ``ceiling``, else the error in words."""
    if ceiling is None or busbw <= ceiling.gbps:
        return None
    return (f"{what}: busbw {busbw:.2f} GB/s is above the ceiling {ceiling.gbps:.2f} GB/s "
            f"({ceiling.source}): no link can carry that; the timing is wrong")


def agreed_errors(comm: Any, mine: list[str]) -> list[str]:
    """Collective: every rank's errors, each named by its rank, on every rank alike (a
    disagreement seen on one rank fails the row everywhere)."""
    found = comm.allgather(mine)
    return [f"rank {r}: {error}" for r, errors in enumerate(found) for error in errors]
