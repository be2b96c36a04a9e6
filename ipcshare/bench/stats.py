"""Repetitions of a suite folded into one result: the median of every figure, with the
smallest and largest value seen as its spread."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..patterns.results import BaselineResult, Measurement, Row, RunResult
from ..patterns.timing import percentile

__all__ = ["median", "Spread", "spread", "aggregate_runs"]


def median(values: Sequence[float]) -> float:
    """The median (the mean of the two middle values for an even count).

    Raises:
        ValueError: no values.
    """
    return percentile(values, 50)


@dataclasses.dataclass(frozen=True)
class Spread:
    """The smallest, median and largest of a set of values."""

    low: float
    mid: float
    high: float


def spread(values: Sequence[float]) -> Spread:
    """Minimum, median and maximum of ``values``.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("spread of no values")
    return Spread(min(values), median(values), max(values))


def aggregate_runs(runs: Sequence[RunResult]) -> RunResult:
    """One result from repetitions of the same run (same op, sizes and modes): each
    figure is the median over the runs, with its min / max in the time and busbw ranges;
    wrong elements add up. A single run comes back unchanged.

    Raises:
        ValueError: no runs, or runs whose sizes or baselines differ.
    """
    if not runs:
        raise ValueError("no runs to aggregate")
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    names = [baseline.name for baseline in first.baselines]
    for run in runs[1:]:
        if [row.size for row in run.rows] != [row.size for row in first.rows]:
            raise ValueError("repetitions measured different sizes")
        if [baseline.name for baseline in run.baselines] != names:
            raise ValueError("repetitions timed different baselines")
    baselines = [
        BaselineResult(baseline.name, baseline.version,
                       _aggregate_rows([run.baselines[index].rows for run in runs]),
                       baseline.label)
        for index, baseline in enumerate(first.baselines)]
    return dataclasses.replace(
        first, rows=_aggregate_rows([run.rows for run in runs]),
        baseline=baselines[0] if baselines else None, extra_baselines=baselines[1:])


def _aggregate_rows(repetitions: list[list[Row]]) -> list[Row]:
    rows = []
    for same_size in zip(*repetitions, strict=True):
        modes = {mode: _aggregate([row.modes[mode] for row in same_size])
                 for mode in same_size[0].modes}
        rows.append(Row(same_size[0].size, same_size[0].count, modes))
    return rows


def _aggregate(measurements: list[Measurement]) -> Measurement:
    times = spread([m.time_us for m in measurements])
    busbws = spread([m.busbw for m in measurements])
    p5s = [m.p5_us for m in measurements if m.p5_us is not None]
    p95s = [m.p95_us for m in measurements if m.p95_us is not None]
    # A baseline's fastest path may change between repetitions: name each one seen.
    paths = sorted({m.path for m in measurements if m.path is not None})
    walls = [m.wall_us for m in measurements if m.wall_us is not None]
    return Measurement(
        time_us=times.mid, algbw=median([m.algbw for m in measurements]), busbw=busbws.mid,
        wrong=sum(m.wrong for m in measurements),
        p5_us=median(p5s) if p5s else None, p95_us=median(p95s) if p95s else None,
        time_us_range=(times.low, times.high), busbw_range=(busbws.low, busbws.high),
        path="+".join(paths) or None,
        wall_us=median(walls) if walls else None,
        # A repetition's measurement error stays an error of the folded figure.
        errors=[error for m in measurements for error in m.errors],
        wrong_paths={path: count for m in measurements for path, count in m.wrong_paths.items()})
