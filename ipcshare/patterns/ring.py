"""Ring: each rank writes into the next rank's window; after n-1 steps every rank holds
every block. Steps are chained by per-step signals, not barriers, so the ring pipelines.
A hop between two nodes goes through MPI instead (the window of a rank on another node is
not mapped here)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from ..topology import mpi
from ..window import USER_SLOT_BASE, Window
from .base import Pattern, SizePlan
from .mpi_path import MpiPath
from .seeding import count_wrong, poison, seeded_bytes

__all__ = ["Ring", "RING_SIGNAL_SLOT"]

# Word of the receiver's pad that the previous rank bumps after each block it wrote.
RING_SIGNAL_SLOT = USER_SLOT_BASE
# MPI tag of the ring's hops between nodes (messages of one pair never overtake).
RING_MPI_TAG = 0x1A6


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
        if not (window.world.is_local(nxt) and window.world.is_local(prev)):
            return self._bind_across_nodes(window, plan)
        steps = ring_steps(n)
        copies = []
        for step in range(steps):
            index = (me - step) % n  # the block received in the previous step (own first)
            copies.append(engine.copier([(window.peer(nxt).slice(index * block, block),
                                          window.local.slice(index * block, block))]))
        post, wait = self._signals(window, to_next=True, from_previous=True)
        counter = self._signal_epoch.setdefault(window, [0])

        def ring() -> None:
            base = counter[0]
            for step in range(steps):
                copies[step]()
                post(base + step + 1)
                wait(base + step + 1)
            counter[0] = base + steps
        return ring

    @staticmethod
    def _signals(window: Window, *, to_next: bool, from_previous: bool) -> tuple[Any, Any]:
        """(post to the next rank, wait for the previous one) per step; None for a hop
        that goes by MPI, whose completion is its own signal."""
        engine, me, n = window.engine, window.rank, window.world_size
        nxt, prev = (me + 1) % n, (me - 1) % n
        post = engine.signal_poster(window.signal_pad(nxt), RING_SIGNAL_SLOT) if to_next else None
        wait = engine.signal_waiter(
            window.signal_pad(me), RING_SIGNAL_SLOT, timeout=window.group.signal_timeout,
            what=f"{window.world.where()} in ring waiting for {window.world.where(prev)}"
        ) if from_previous else None
        return post, wait

    def _bind_across_nodes(self, window: Window, plan: SizePlan) -> Callable[[], None]:
        """The ring at a rank whose hop out (to the next rank) or in (from the previous
        one) crosses nodes: that hop goes by MPI, the other by IPC and signals."""
        MPI = mpi()
        engine, world, block = window.engine, window.world, plan.block_bytes
        me, n, comm = window.rank, window.world_size, window.world.comm
        nxt, prev = (me + 1) % n, (me - 1) % n
        steps, path = ring_steps(n), MpiPath(engine, window.group.backend_name)
        send_by_mpi, receive_by_mpi = not world.is_local(nxt), not world.is_local(prev)
        # Step s sends block (me - s) and receives block (me - 1 - s), which it sends on.
        sources = [window.local.slice(((me - step) % n) * block, block) for step in range(steps)]
        copies = [] if send_by_mpi else [
            engine.copier([(window.peer(nxt).slice(source.ptr - window.local.ptr, block),
                            source)]) for source in sources]
        receivers = [path.receiver(window.local.slice(((me - 1 - step) % n) * block, block))
                     for step in range(steps)] if receive_by_mpi else []
        post, wait = self._signals(window, to_next=not send_by_mpi,
                                   from_previous=not receive_by_mpi)
        counter = self._signal_epoch.setdefault(window, [0])

        def ring() -> None:
            base = counter[0]
            for step in range(steps):
                requests, outgoing = [], None
                if receive_by_mpi:
                    target, _ = receivers[step]
                    requests.append(comm.Irecv([target, MPI.BYTE], source=prev, tag=RING_MPI_TAG))
                if send_by_mpi:
                    engine.synchronize()  # the block came in by the previous step
                    outgoing = path.sendable(sources[step])  # alive until the send is done
                    requests.append(comm.Isend([outgoing, MPI.BYTE], dest=nxt, tag=RING_MPI_TAG))
                else:
                    copies[step]()
                    post(base + step + 1)
                if wait is not None:
                    wait(base + step + 1)
                MPI.Request.Waitall(requests)
                if receive_by_mpi:
                    receivers[step][1]()  # staged bytes into the window
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
