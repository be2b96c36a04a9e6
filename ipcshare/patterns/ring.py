"""Ring: each rank writes into the next rank's window; after n-1 steps every rank holds
every block. Steps are chained by per-step signals, not barriers, so the ring pipelines."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from ..window import USER_SLOT_BASE, Window
from .base import Pattern, SizePlan
from .seeding import count_wrong, poison, seeded_bytes

__all__ = ["Ring", "RING_SIGNAL_SLOT"]

# Word of the receiver's pad that the previous rank bumps after each block it wrote.
RING_SIGNAL_SLOT = USER_SLOT_BASE


def ring_steps(world_size: int) -> int:
    """Steps in one ring pass (a world of one copies its block onto itself once)."""
    return max(world_size - 1, 1)


class Ring(Pattern):
    """``size`` is the block each rank sends per step; bandwidth follows nccl-tests'
    sendrecv: algbw = bytes sent per rank / time, busbw = algbw.

    Window layout per rank: n blocks; block r starts as rank r's input.
    """

    name = "ring"
    modes = ("ring",)

    def __init__(self) -> None:
        # Per window, the last value signalled: identical on every rank, since every rank
        # runs the same sequence of operations on the window.
        self._signal_epoch: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def plan(self, size: int, world_size: int, element_size: int) -> SizePlan:
        count = max(1, size // element_size)
        return SizePlan(size=count * element_size, count=count,
                        block_bytes=count * element_size, element_size=element_size)

    def window_bytes(self, plan: SizePlan, world_size: int) -> int:
        return plan.block_bytes * world_size

    def prepare(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> None:
        engine, me, block = window.engine, window.rank, plan.block_bytes
        engine.upload(window.local.slice(0, block * window.world_size),
                      poison(block * window.world_size))
        engine.upload(window.local.slice(me * block, block), seeded_bytes(iteration, me, block))

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        engine, me, n, block = window.engine, window.rank, window.world_size, plan.block_bytes
        nxt, prev = (me + 1) % n, (me - 1) % n
        steps = ring_steps(n)
        copies = []
        for step in range(steps):
            index = (me - step) % n  # the block received in the previous step (own first)
            copies.append(engine.copier([(window.peer(nxt).slice(index * block, block),
                                          window.local.slice(index * block, block))]))
        post = engine.signal_poster(window.signal_pad(nxt), RING_SIGNAL_SLOT)
        wait = engine.signal_waiter(
            window.signal_pad(me), RING_SIGNAL_SLOT, timeout=window.group.signal_timeout,
            what=f"{window.world.where()} in ring waiting for {window.world.where(prev)}")
        counter = self._signal_epoch.setdefault(window, [0])

        def ring() -> None:
            base = counter[0]
            for step in range(steps):
                copies[step]()
                post(base + step + 1)
                wait(base + step + 1)
            counter[0] = base + steps
        return ring

    def check(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> int:
        block, n = plan.block_bytes, window.world_size
        got = window.engine.download(window.local.slice(0, block * n))
        return sum(
            count_wrong(got[r * block:(r + 1) * block], seeded_bytes(iteration, r, block),
                        plan.element_size)
            for r in range(n))

    def bandwidth(self, plan: SizePlan, seconds: float, world_size: int) -> tuple[float, float]:
        algbw = plan.block_bytes * ring_steps(world_size) / seconds / 1e9
        return algbw, algbw
