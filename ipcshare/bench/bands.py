"""The closing summary: each baseline's time over ours (the speedup, read as the table's
speedup column is), per size band (small sizes are latency-bound, large ones
bandwidth-bound, and the middle is where the two meet)."""

from __future__ import annotations

import dataclasses
import math

from ..patterns.results import RunResult

__all__ = ["SIZE_BANDS", "size_band", "BandRatio", "band_ratios"]

_SMALL_MAX = 64 << 10     # <= 64 KiB: latency-bound
_LARGE_MIN = 16 << 20     # >= 16 MiB: bandwidth-bound
SIZE_BANDS = ("<= 64K", "> 64K, < 16M", ">= 16M")  # none overlaps another


def size_band(size: int) -> str:
    """The band of a table size (bytes): one of :data:`SIZE_BANDS`."""
    if size <= _SMALL_MAX:
        return SIZE_BANDS[0]
    if size >= _LARGE_MIN:
        return SIZE_BANDS[2]
    return SIZE_BANDS[1]


@dataclasses.dataclass(frozen=True)
class BandRatio:
    """A baseline's time over ours in one size band: the geometric mean over the band's
    sizes (above 1: we are faster), its smallest and largest value, and the count."""

    band: str
    baseline: str
    ratio: float
    low: float
    high: float
    sizes: int


def band_ratios(result: RunResult) -> list[BandRatio]:
    """Per baseline of ``result``, per band with sizes, the baseline's primary time over
    ours (rows that are not usable figures, wrong or failing a measurement check, are
    left out: nobody divides by them), bands in size order."""
    ratios = []
    for baseline in result.baselines:
        by_band: dict[str, list[float]] = {band: [] for band in SIZE_BANDS}
        for ours, theirs in zip(result.rows, baseline.rows, strict=True):
            if ours.primary.usable and theirs.primary.usable:
                by_band[size_band(ours.size)].append(theirs.primary.time_us / ours.primary.time_us)
        for band, values in by_band.items():
            if values:
                mean = math.exp(sum(math.log(value) for value in values) / len(values))
                ratios.append(BandRatio(band, baseline.name, mean, min(values), max(values),
                                        len(values)))
    return ratios
