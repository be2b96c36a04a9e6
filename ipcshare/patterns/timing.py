"""Timing modes: nccl-tests' averaged back-to-back runs, and per-sample latency with the
slowest rank of each sample, summarised by its median and its 5th / 95th percentiles."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..topology.world import mpi

__all__ = ["TIMING_MODES", "LATENCY_LABEL", "GRAPH_LABEL", "GRAPH_LATENCY_LABEL",
           "timing_label", "percentile", "LatencySummary", "summarize_samples",
           "slowest_rank_samples", "mean_over_ranks"]

# "nccl-tests": barrier, n back-to-back operations, one host timer, averaged over ranks.
# "latency": n samples of one operation each, the slowest rank per sample.
TIMING_MODES = ("nccl-tests", "latency")
# How the table's title and the bench report name a run's timing in words (the JSON
# document says "timing": "eager" | "graph" and, for latency, "statistic": "median").
LATENCY_LABEL = "latency (eager samples)"
GRAPH_LABEL = "graph"
GRAPH_LATENCY_LABEL = "latency (graph replay samples)"


def timing_label(timing: str, graph: bool) -> str:
    """A timing mode, eager or in CUDA graphs, in the words the reports use."""
    if timing == "latency":
        return GRAPH_LATENCY_LABEL if graph else LATENCY_LABEL
    return GRAPH_LABEL if graph else "eager"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100) of ``values``.

    Interpolates linearly between the two nearest ranks (numpy's default method), so
    the 50th percentile of an even count is the mean of the two middle values.

    Raises:
        ValueError: ``values`` is empty, or ``q`` is not within [0, 100].
    """
    if not 0 <= q <= 100:  # also refuses NaN
        raise ValueError(f"a percentile lies within [0, 100], got {q!r}")
    ordered = sorted(float(value) for value in values)
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q / 100
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


@dataclasses.dataclass(frozen=True)
class LatencySummary:
    """Median and 5th / 95th percentiles of a set of samples, in seconds."""

    p5: float
    p50: float
    p95: float


def summarize_samples(samples: Sequence[float]) -> LatencySummary:
    """Median, p5 and p95 of ``samples``.

    Raises:
        ValueError: no samples.
    """
    return LatencySummary(percentile(samples, 5), percentile(samples, 50),
                          percentile(samples, 95))


def slowest_rank_samples(comm: Any, samples: Sequence[float]) -> list[float]:
    """Collective: for each sample index, the largest value over the ranks of ``comm``.

    Every rank must pass the same number of samples.
    """
    MPI = mpi()
    values = np.ascontiguousarray(samples, dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, values, op=MPI.MAX)
    return values.tolist()


def mean_over_ranks(comm: Any, values: Sequence[float]) -> list[float]:
    """Collective: each of ``values`` averaged over the ranks of ``comm``.

    Reduced as a float64 array, element by element (a pickled tuple "summed" by MPI
    would be concatenated instead: 2026-11-23 to 11-26 the eager timer reported rank 0's
    time divided by the world size that way).
    """
    MPI = mpi()
    total = np.ascontiguousarray(values, dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    return (total / comm.Get_size()).tolist()
