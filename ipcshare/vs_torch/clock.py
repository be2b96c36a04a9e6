"""The comparison's own timer and second clock: CUDA events on the torch stream around the
timed calls, the host clock from before the first enqueue to after a full synchronize,
the clock's offset over an empty stretch, and their disagreement per stretch.

Kept apart so that it can give way to the driver's timer and clock check
(patterns/timing.py, patterns/clock_check.py) in one place: the runner calls
``EventClock.offset``, ``EventClock.timed`` and ``clock_errors``, nothing else of it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..patterns.clock_check import clock_disagreement, clock_offset

__all__ = ["EventClock", "clock_errors"]


def clock_errors(readings: dict[str, tuple[float, float]], offset_s: float) -> list[str]:
    """This rank's disagreements between each timed stretch's events and the host
    clock: ``readings`` maps a stretch's name to (event seconds, host seconds from before
    its first enqueue to after a full synchronize); ``offset_s`` is what the host clock
    reads over an empty stretch."""
    found = []
    for what, (timer_s, wall_s) in readings.items():
        error = clock_disagreement(timer_s, wall_s, what, offset_s)
        if error:
            found.append(error)
    return found


class EventClock:
    """CUDA events on ``stream`` (torch's) and the host clock over the same calls; a
    stretch starts once every rank of ``comm`` is there."""

    def __init__(self, torch: Any, stream: Any, comm: Any) -> None:
        self.torch, self.stream, self.comm = torch, stream, comm

    def offset(self) -> float:
        """The host clock's seconds over an empty stretch (what it adds to any)."""
        torch = self.torch

        def empty() -> tuple[float, float]:
            begin, end = self.events()
            torch.cuda.synchronize()
            begin.record(self.stream)
            start = time.perf_counter()
            end.record(self.stream)
            torch.cuda.synchronize()
            return begin.elapsed_time(end) / 1e3, time.perf_counter() - start
        return clock_offset(empty)

    def events(self) -> tuple[Any, Any]:
        """Two timing events."""
        event = self.torch.cuda.Event
        return event(enable_timing=True), event(enable_timing=True)


    def timed(self, run: Callable[[], None], times: int) -> tuple[float, float]:
        """(event seconds, host seconds from before the first enqueue to after a full
        synchronize) of ``times`` runs back to back on the stream."""
        torch = self.torch
        begin, end = self.events()
        torch.cuda.synchronize()
        self.comm.Barrier()
        begin.record(self.stream)
        start = time.perf_counter()
        for _ in range(times):
            run()
        end.record(self.stream)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        return begin.elapsed_time(end) / 1e3, wall
