"""All-gather by single copy: each rank pushes its block straight into every peer's output
window, between two barriers (outputs free to write; every block landed)."""

from __future__ import annotations

from collections.abc import Callable

from ..runtime.errors import ConfigError
from ..window import Window
from .allgather_across_nodes import bind_hierarchical
from .base import Pattern, SizePlan, align
from .seeding import count_wrong, poison, seeded_bytes

__all__ = ["AllGather", "allgather_busbw_factor"]


def allgather_busbw_factor(world_size: int) -> float:
    """nccl-tests' all-gather bus factor (n-1)/n."""
    return (world_size - 1) / world_size if world_size > 1 else 1.0


class AllGather(Pattern):
    """nccl-tests' all-gather: ``size`` is the total gathered bytes, each rank gives size/n.

    Window layout per rank: [send block][pad to 4 KiB][n output blocks]. In place, the
    send block is the rank's own slot of the output.
    """

    name = "allgather"
    modes = ("out-of-place", "in-place")

    def __init__(self, algo: str = "auto") -> None:
        # auto: single copy within one node, hierarchical when the job spans nodes.
        self.algo = algo

    def plan(self, size: int, world_size: int, element_size: int) -> SizePlan:
        per_rank = max(1, size // (world_size * element_size))
        block = per_rank * element_size
        return SizePlan(size=block * world_size, count=per_rank * world_size,
                        block_bytes=block, element_size=element_size)

    def window_bytes(self, plan: SizePlan, world_size: int) -> int:
        return align(plan.block_bytes) + plan.block_bytes * world_size

    @staticmethod
    def _recv_offset(plan: SizePlan) -> int:
        return align(plan.block_bytes)

    def _send_of(self, window: Window, rank: int, plan: SizePlan, mode: str):
        buffer = window.peer(rank)
        if mode == "in-place":
            return buffer.slice(self._recv_offset(plan) + rank * plan.block_bytes, plan.block_bytes)
        return buffer.slice(0, plan.block_bytes)

    def _recv_slot(self, window: Window, slot: int, plan: SizePlan):
        return window.local.slice(self._recv_offset(plan) + slot * plan.block_bytes,
                                  plan.block_bytes)

    def prepare(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> None:
        engine, n = window.engine, window.world_size
        output = window.local.slice(self._recv_offset(plan), plan.block_bytes * n)
        engine.upload(output, poison(output.nbytes))
        engine.upload(self._send_of(window, window.rank, plan, mode),
                      seeded_bytes(iteration, window.rank, plan.block_bytes))

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        nodes = window.world.node_count
        if nodes > 1:
            if self.algo != "auto":
                raise ConfigError(
                    f"--algo {self.algo} maps every peer's window, which works within one "
                    f"node; this job spans {nodes} nodes: use --algo hierarchical (or auto)")
            return bind_hierarchical(self, window, plan, mode)
        pairs, sends, receives = self.copies(window, plan, mode)
        copy_all = window.engine.copier(pairs)
        staged = (window.staged.bind(window.engine, sends=sends, receives=receives)
                  if sends else None)
        barrier = window.barrier

        def allgather() -> None:
            barrier()   # every peer is done with its output from before: we may write it
            copy_all()
            if staged is not None:
                staged()
            barrier()   # every peer's block has landed in our output
        return allgather

    def copies(self, window: Window, plan: SizePlan, mode: str) -> tuple[list, list, list]:
        """What one rank moves: ``(pairs, sends, receives)``. ``pairs`` are the direct
        ``(destination, source)`` copies, our own slot last when out of place; ``sends``
        and ``receives`` are the ``(peer, buffer)`` halves of staged copies for peers
        without peer access."""
        me, n = window.rank, window.world_size
        mine = self._send_of(window, me, plan, mode)
        pairs, sends, receives = [], [], []
        for step in range(1, n):
            # Push: write our block into every peer's output (on NVLink the copy engine
            # writes faster than it reads); staggered so peers spread their traffic.
            peer = (me + step) % n
            if window.path(peer) == "direct":
                target = window.peer(peer).slice(
                    self._recv_offset(plan) + me * plan.block_bytes, plan.block_bytes)
                pairs.append((target, mine))
            else:
                # No peer access: the peer pulls our block in chunks through a relay's
                # window or pinned host memory, while we push them (staged_copy).
                sends.append((peer, mine))
                receives.append((peer, self._recv_slot(window, peer, plan)))
        if mode == "out-of-place":
            pairs.append((self._recv_slot(window, me, plan), mine))
        return pairs, sends, receives

    def check(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> int:
        got = window.engine.download(
            window.local.slice(self._recv_offset(plan), plan.block_bytes * window.world_size))
        wrong = 0
        for rank in range(window.world_size):
            block = got[rank * plan.block_bytes:(rank + 1) * plan.block_bytes]
            wrong += count_wrong(block, seeded_bytes(iteration, rank, plan.block_bytes),
                                 plan.element_size)
        return wrong

    def bandwidth(self, plan: SizePlan, seconds: float, world_size: int) -> tuple[float, float]:
        algbw = plan.size / seconds / 1e9
        return algbw, algbw * allgather_busbw_factor(world_size)
