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

This module is the one implementation of the second clock: the driver (ours and the
GPU baselines, hence every command, ``ipcshare bench`` and the IPC half of ``ipcshare
p2p``) and the PyTorch comparison read it. Its verdict is one-sided (a timer may not
pass the host clock, nor miss more than the tolerance of it), and a disagreement is
only one when it comes back: the stretch is timed again on every rank first
(``agreed_stretch``), and the row counts how often (``clock_rechecks``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..topology.link_speed import Ceiling
from .timing import percentile

__all__ = ["CLOCK_TOLERANCE", "CLOCK_SLACK_S", "CLOCK_RETRIES", "clock_disagreement",
           "clock_offset", "engine_clock_offset", "latency_clock_disagreement",
           "agreed_stretch", "torch_event_stretch", "torch_event_reading",
           "torch_clock_offset", "ceiling_error",
           "agreed_errors"]

# The two clocks may differ by this fraction of the host clock plus CLOCK_SLACK_S, once
# the host clock's own offset is taken off: what it reads over an empty stretch (the
# start event reaching the GPU, the finish being seen through a cuCtxSynchronize),
# measured on each rank before it times. On 4 H200s (2026-11-26) that offset read 12-14
# µs, but stretches of 3 real operations still read 26-44 µs more on the host clock than
# on the events (the end seen through the context's synchronize after kernels that ran
# on several streams and peers): the slack covers that, and a timer that misses the
# work (2.6 against 12.4 µs per call over 100 calls) is still far outside it.
CLOCK_TOLERANCE = 0.10
CLOCK_SLACK_S = 50e-6
# Empty stretches timed to find that offset (their median is taken).
OFFSET_SAMPLES = 7
# How many times a stretch whose clocks disagreed on some rank is timed again, on every
# rank together, before the disagreement stands. The host clock brackets the work (it
# starts before the first enqueue and stops once a full synchronize returned), so a
# hiccup of the host (a descheduled rank, a page fault, a collector: on 4 H200s, 2026-11-27,
# single readings of 548-1,299 µs over 181 µs of events, differing per rank) can only
# lengthen it, and it does not come back on demand; a timer on a stream the work is not
# on misses the work every time.
CLOCK_RETRIES = 2


def clock_disagreement(timer_s: float, wall_s: float | None, what: str,
                       offset_s: float = 0.0, *,
                       parts: tuple[float, float] | None = None) -> str | None:
    """None when ``timer_s`` (the timer's seconds for a timed stretch) agrees with
    ``wall_s`` (the host clock over the same stretch), else the error in words. No
    second clock (None) is no disagreement.

    One-sided, as the clocks are: the timer may not pass the host clock, which brackets
    it (beyond the tolerance: it counted time that did not pass), nor fall short of the
    host clock less ``offset_s`` (what the host clock reads over an empty stretch) by
    more than the tolerance (it missed work). The offset only ever excuses a host clock
    that reads long: where it was measured high (a GPU shared by turns), clocks that
    agree still agree.

    ``parts`` (``Timer.wall_parts``: the host clock when the last enqueue returned and
    when the timer's end was seen finished), where known, decide a host clock that reads
    long. Work on a stream the timer is not on can only hold up the full synchronize
    that follows the end being seen (the tail); a host slow to enqueue or to poll (a
    descheduled rank, a busy proxy thread on its core) lengthens the time before it.
    So the timer missed work only where the tail, less the offset, is beyond the
    tolerance of the timer; and the error names the parts."""
    if wall_s is None:
        return None
    if timer_s > wall_s * (1 + CLOCK_TOLERANCE) + CLOCK_SLACK_S:
        return (f"{what}: the timer gave {timer_s * 1e6:.2f} us but the host clock from the "
                f"first enqueue to a full synchronize, which brackets it, only "
                f"{wall_s * 1e6:.2f} us (allowed: {CLOCK_TOLERANCE:.0%} + "
                f"{CLOCK_SLACK_S * 1e6:g} us): the timer counted time that did not pass")
    expected = max(wall_s - offset_s, 0.0)
    if timer_s >= expected * (1 - CLOCK_TOLERANCE) - CLOCK_SLACK_S:
        return None
    if parts is not None and _tail_is_short(timer_s, wall_s, offset_s, parts):
        return None
    return (f"{what}: the timer gave {timer_s * 1e6:.2f} us but the host clock from the first "
            f"enqueue to a full synchronize {wall_s * 1e6:.2f} us, {offset_s * 1e6:.2f} us of "
            f"it its offset{_parts_in_words(wall_s, parts)} (allowed: {CLOCK_TOLERANCE:.0%} + "
            f"{CLOCK_SLACK_S * 1e6:g} us; the same on {CLOCK_RETRIES} more tries): work the "
            "timer did not see, as on a stream the work is not on")


def _tail_is_short(timer_s: float, wall_s: float, offset_s: float,
                   parts: tuple[float, float]) -> bool:
    """Whether the host clock's time after the timer's end was seen (what other
    streams can add) is within the tolerance of the timer, the offset taken off."""
    _enqueued, end_seen = parts
    tail = max(wall_s - end_seen, 0.0)
    return tail - offset_s <= timer_s * CLOCK_TOLERANCE + CLOCK_SLACK_S


def _parts_in_words(wall_s: float, parts: tuple[float, float] | None) -> str:
    if parts is None:
        return ""
    enqueued, end_seen = parts
    return (f"; the last enqueue returned at {enqueued * 1e6:.2f} us, the timer's end was "
            f"seen at {end_seen * 1e6:.2f} us, the other streams took "
            f"{(wall_s - end_seen) * 1e6:.2f} us more")


def clock_offset(stretch: Callable[[], tuple[float, float]]) -> float:
    """The host clock's offset: the median over ``OFFSET_SAMPLES`` empty stretches of
    (host clock - timer), each ``stretch()`` returning (timer, host clock) seconds."""
    readings = [stretch() for _ in range(OFFSET_SAMPLES)]
    return max(percentile([wall - timer for timer, wall in readings], 50), 0.0)


def engine_clock_offset(engine: Any) -> float:
    """``clock_offset`` of an engine's timer (0 for timers whose clocks are one)."""
    def empty() -> tuple[float, float]:
        timer = engine.timer()
        timer.start()
        elapsed = timer.stop()
        return elapsed, timer.wall_seconds if timer.wall_seconds is not None else elapsed
    return clock_offset(empty)


def latency_clock_disagreement(timer_samples: Sequence[float],
                               wall_samples: Sequence[float], what: str,
                               offset_s: float = 0.0) -> str | None:
    """``clock_disagreement`` of the medians of per-sample readings."""
    if not timer_samples or not wall_samples:
        return None
    return clock_disagreement(percentile(timer_samples, 50), percentile(wall_samples, 50),
                              f"{what} (median sample)", offset_s)


Reading = TypeVar("Reading")


def agreed_stretch(comm: Any, stretch: Callable[[], Reading],
                   verdict: Callable[[Reading], str | None],
                   retries: int = CLOCK_RETRIES) -> tuple[Reading, str | None, int]:
    """Collective: ``stretch()`` (a timed stretch that every rank of ``comm`` runs
    together) and this rank's ``verdict`` on its reading; while the verdict of some rank
    is a disagreement, every rank times the stretch again, at most ``retries`` more
    times. Returns (the last reading, this rank's disagreement on it or None, how many
    times the stretch was timed again)."""
    again = 0
    while True:
        reading = stretch()
        error = verdict(reading)
        if again == retries or not any(comm.allgather(error is not None)):
            return reading, error, again
        again += 1


def torch_event_stretch(torch: Any, device: Any, stream: Any,
                        enqueue: Callable[[], None]) -> tuple[float, float]:
    """(timer, host clock) seconds of ``enqueue()`` on a torch ``stream``: the first two
    of ``torch_event_reading``."""
    timer, wall, _parts = torch_event_reading(torch, device, stream, enqueue)
    return timer, wall


def torch_event_reading(torch: Any, device: Any, stream: Any, enqueue: Callable[[], None]
                        ) -> tuple[float, float, tuple[float, float]]:
    """(timer, host clock, its parts) seconds of ``enqueue()`` on a torch ``stream``,
    read as ``CudaTimer`` reads ours: two CUDA events on the stream, and the host's time
    from before the first enqueue to a full synchronize of ``device``, the end event spun
    on first (a synchronize that sleeps would add its wake-up to the host clock). The
    parts are ``CudaTimer.wall_parts``': when ``enqueue()`` returned, and when the end
    event was seen done."""
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    begin.record(stream)
    started = time.perf_counter()
    enqueue()
    enqueued = time.perf_counter() - started
    end.record(stream)
    spin_until = started + _SPIN_S
    while not end.query() and time.perf_counter() < spin_until:
        pass
    end.synchronize()
    end_seen = time.perf_counter() - started
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - started
    # elapsed_time is in milliseconds
    return begin.elapsed_time(end) / 1e3, wall, (enqueued, end_seen)


def torch_clock_offset(torch: Any, device: Any, stream: Any) -> float:
    """``clock_offset`` of ``torch_event_stretch`` on ``stream``."""
    def empty() -> tuple[float, float]:
        torch.cuda.synchronize(device)
        return torch_event_stretch(torch, device, stream, lambda: None)
    return clock_offset(empty)


# How long a torch stretch spins on its end event before the synchronize (as CudaTimer).
_SPIN_S = 0.05


def ceiling_error(busbw: float, ceiling: Ceiling | None, what: str,
                  quantity: str = "busbw") -> str | None:
    """None when ``busbw`` (GB/s; ``quantity`` says what rate it is) is within
    ``ceiling``, else the error in words."""
    if ceiling is None or busbw <= ceiling.gbps:
        return None
    return (f"{what}: {quantity} {busbw:.2f} GB/s is above the ceiling {ceiling.gbps:.2f} GB/s "
            f"({ceiling.source}): no link can carry that; the timing is wrong")


def agreed_errors(comm: Any, mine: list[str]) -> list[str]:
    """Collective: every rank's errors, each named by its rank, on every rank alike (a
    disagreement seen on one rank fails the row everywhere)."""
    found = comm.allgather(mine)
    return [f"rank {r}: {error}" for r, errors in enumerate(found) for error in errors]
