"""Buffer rotation at small sizes: consecutive operations use disjoint regions of the
window (and of a baseline's buffers) in turn, so none finds its data already in a cache."""

from __future__ import annotations

from typing import Any

from ..window import Window
from .base import Pattern, SizePlan, align

__all__ = ["ROTATION_MAX_BLOCK_BYTES", "rotation_count", "warmup_iterations",
           "rotated_window_bytes", "window_regions", "WindowRegion"]

# Rotate while each rank's block is at most this big; larger blocks outgrow the caches.
ROTATION_MAX_BLOCK_BYTES = 1 << 20


def rotation_count(plan: SizePlan, rotate: int) -> int:
    """How many buffer sets ``plan`` cycles through when ``rotate`` are asked for."""
    return rotate if plan.block_bytes <= ROTATION_MAX_BLOCK_BYTES else 1


def warmup_iterations(warmup: int, buffers: int) -> int:
    """Warm-up operations before timing: ``warmup``, but with several buffer sets at least
    one on each, so no first touch of a page (a fault) lands in the timed loop."""
    return warmup if buffers == 1 else max(warmup, buffers)


def rotated_window_bytes(pattern: Pattern, plan: SizePlan, world_size: int, rotate: int) -> int:
    """Window bytes per rank for ``plan`` with its regions side by side (4 KiB aligned)."""
    needed = pattern.window_bytes(plan, world_size)
    count = rotation_count(plan, rotate)
    return needed if count == 1 else align(needed) * count


def window_regions(window: Window, pattern: Pattern, plan: SizePlan, rotate: int) -> list[Any]:
    """The regions that ``plan``'s operations cycle through: the window itself first, then
    one :class:`WindowRegion` per further buffer set.

    Bind the window before its regions: state that a pattern keeps per window (the ring's
    signal epochs) is then keyed by the window, which outlives the regions.
    """
    count = rotation_count(plan, rotate)
    stride = align(pattern.window_bytes(plan, window.world_size))
    return [window] + [WindowRegion(window, index * stride, stride) for index in range(1, count)]


class WindowRegion:
    """The byte range ``[offset, offset + nbytes)`` of every rank's buffer of a window,
    seen as a window: ``local`` and ``peer(r)`` are that range; signal pads, barrier,
    engine and ranks are the window's own.

    A region compares and hashes equal to its window, so a pattern's per-window state
    (the ring's signal epochs) is shared with the window, as the signal pads are.
    """

    def __init__(self, window: Window, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > window.nbytes:
            raise ValueError(f"region [{offset}, {offset + nbytes}) lies outside a window of "
                             f"{window.nbytes} bytes")
        self.window = window
        self.offset = offset
        self.nbytes = nbytes

    @property
    def local(self) -> Any:
        """This rank's part of the region."""
        return self.window.local.slice(self.offset, self.nbytes)

    def peer(self, rank: int) -> Any:
        """Rank ``rank``'s part of the region, mapped here."""
        return self.window.peer(rank).slice(self.offset, self.nbytes)

    @property
    def buffer_ptrs(self) -> list[int]:
        """One address per rank (0 for ranks on other nodes)."""
        return [ptr + self.offset if ptr else 0 for ptr in self.window.buffer_ptrs]

    def __getattr__(self, name: str) -> Any:
        # Everything but the data range is the window's (engine, barrier, pads, ranks).
        if name == "window":  # not set yet (a copy in the making): no recursion
            raise AttributeError(name)
        return getattr(self.window, name)

    def __eq__(self, other: object) -> bool:
        # Regions, stream views and the window itself are all the same window.
        return _base_window(other) is _base_window(self.window)

    def __hash__(self) -> int:
        return hash(_base_window(self.window))

    def __repr__(self) -> str:
        return f"WindowRegion({self.window!r}, offset={self.offset}, nbytes={self.nbytes})"


def _base_window(window: Any) -> Any:
    """The Window under a region or a stream view (or ``window`` itself)."""
    while not isinstance(window, Window) and hasattr(window, "window"):
        window = window.window
    return window
