"""Ring: each rank writes into the next rank's window; after n-1 steps every rank holds
every block. Steps are chained by per-step signals, not barriers, so the ring pipelines.
A hop between two nodes goes through MPI instead (the window of a rank on another node is
not mapped here)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from ..collectives.across_nodes.mpi_path import MpiPath
from ..topology.world import mpi
from ..window import Window
from ..window.layout import RING_SIGNAL_SLOT
from .base import Pattern, SizePlan
from .seeding import count_wrong, poison, seeded_bytes

__all__ = ["Ring", "RING_SIGNAL_SLOT"]

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
        # A hop between GPUs without peer access goes through the window's staged copies:
        # the sender pushes chunks, the receiver pulls them, and the pull's completion is
        # the step's signal (the pad of a peer we cannot map is out of reach anyway).
        send_staged = n > 1 and window.path(nxt) != "direct"
        receive_staged = n > 1 and window.path(prev) != "direct"
        sources = [window.local.slice(((me - step) % n) * block, block) for step in range(steps)]
        copies = [] if send_staged else [
            engine.copier([(window.peer(nxt).slice(source.ptr - window.local.ptr, block),
                            source)]) for source in sources]
        staged = self._staged_steps(window, plan, send_staged, receive_staged)
        post, wait = self._signals(window, to_next=not send_staged,
                                   from_previous=not receive_staged)
        counter = self._signal_epoch.setdefault(window, [0])

        hop = _node_hop(copies, post, staged, wait)

        def ring() -> None:
            base = counter[0]
            for step in range(steps):
                hop(step, base + step + 1)
            counter[0] = base + steps
        return ring

    @staticmethod
    def _staged_steps(window: Window, plan: SizePlan, send: bool,
                      receive: bool) -> list[Callable[[], None]]:
        """Per step, the staged half of the ring at this rank: step s sends block
        (me - s) to the next rank and receives block (me - 1 - s) from the previous one,
        each only where that hop has no peer access (empty when neither does)."""
        if not (send or receive):
            return []
        me, n, block = window.rank, window.world_size, plan.block_bytes
        nxt, prev = (me + 1) % n, (me - 1) % n
        return [window.staged.bind(
            window.engine,
            sends=[(nxt, window.local.slice(((me - step) % n) * block, block))] if send else [],
            receives=[(prev, window.local.slice(((me - 1 - step) % n) * block, block))]
            if receive else [])
            for step in range(ring_steps(n))]

    @staticmethod
    def _signals(window: Window, *, to_next: bool, from_previous: bool) -> tuple[Any, Any]:
        """(post to the next rank, wait for the previous one) per step; None for a hop
        that goes by MPI, whose completion is its own signal."""
        engine, me, n = window.engine, window.rank, window.world_size
        nxt, prev = (me + 1) % n, (me - 1) % n
        post = engine.signal_poster(window.signal_pad(nxt), RING_SIGNAL_SLOT) if to_next else None
        wait = engine.signal_waiter(
            window.signal_pad(me), RING_SIGNAL_SLOT, timeout=window.signal_timeout,
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
        steps, path = ring_steps(n), MpiPath(engine, window.backend.device_memory)
        send_by_mpi, receive_by_mpi = not world.is_local(nxt), not world.is_local(prev)
        # Step s sends block (me - s) and receives block (me - 1 - s), which it sends on.
        sources = [window.local.slice(((me - step) % n) * block, block) for step in range(steps)]
        # The hop that stays on the node goes direct or, without peer access, staged.
        send_staged = not send_by_mpi and window.path(nxt) != "direct"
        receive_staged = not receive_by_mpi and window.path(prev) != "direct"
        copies = [] if send_by_mpi or send_staged else [
            engine.copier([(window.peer(nxt).slice(source.ptr - window.local.ptr, block),
                            source)]) for source in sources]
        staged = self._staged_steps(window, plan, send_staged, receive_staged)
        receivers = [path.receiver(window.local.slice(((me - 1 - step) % n) * block, block))
                     for step in range(steps)] if receive_by_mpi else []
        post, wait = self._signals(window, to_next=not (send_by_mpi or send_staged),
                                   from_previous=not (receive_by_mpi or receive_staged))
        counter = self._signal_epoch.setdefault(window, [0])
        hop = _node_hop(copies, post, staged, wait)

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
                hop(step, base + step + 1)
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


def _node_hop(copies: list, post: Any, staged: list, wait: Any) -> Callable[[int, int], None]:
    """The part of a ring step that stays on the node: the push to the next rank and its
    signal (when that hop is direct), the staged halves (hops without peer access), and
    the wait for the previous rank's signal (when its hop is direct)."""
    def hop(step: int, value: int) -> None:
        if post is not None:
            copies[step]()
            post(value)
        if staged:
            staged[step]()
        if wait is not None:
            wait(value)
    return hop
