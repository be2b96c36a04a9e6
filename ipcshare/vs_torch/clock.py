"""The comparison's timer and second clock, the driver's own (patterns/clock_check.py):
CUDA events on the torch stream around the timed calls, the host clock from before the
first enqueue to after a full synchronize, the clock's offset over an empty stretch, a
stretch timed again on every rank while some rank's clocks disagree, and the
disagreements that remain per stretch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..patterns.clock_check import (
    agreed_stretch,
    clock_disagreement,
    torch_clock_offset,
    torch_event_reading,
)

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
    stretch starts once every rank of ``comm`` is there. ``rechecks`` counts the
    stretches timed again (clock_check.agreed_stretch)."""

    def __init__(self, torch: Any, stream: Any, comm: Any) -> None:
        self.torch, self.stream, self.comm = torch, stream, comm
        self._offset: float | None = None
        self.rechecks = 0

    def offset(self) -> float:
        """The host clock's seconds over an empty stretch (what it adds to any),
        measured once."""
        if self._offset is None:
            self._offset = torch_clock_offset(self.torch, None, self.stream)
        return self._offset

    def timed(self, run: Callable[[], None], times: int) -> tuple[float, float]:
        """Collective: (event seconds, host seconds from before the first enqueue to
        after a full synchronize) of ``times`` runs back to back on the stream, timed
        again while the two clocks disagree on some rank (at most CLOCK_RETRIES times)."""
        torch, offset = self.torch, self.offset()

        def enqueue_all() -> None:
            for _ in range(times):
                run()

        def stretch() -> tuple[float, float, tuple[float, float]]:
            torch.cuda.synchronize()
            self.comm.Barrier()
            return torch_event_reading(torch, None, self.stream, enqueue_all)

        (timer_s, wall_s, _parts), _error, again = agreed_stretch(
            self.comm, stretch, lambda timed: clock_disagreement(
                timed[0], timed[1], "", offset, parts=timed[2]))
        self.rechecks += again
        return timer_s, wall_s
