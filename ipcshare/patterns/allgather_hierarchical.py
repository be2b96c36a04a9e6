"""Hierarchical all-gather for jobs that span nodes: the node's blocks by IPC inside each
node, node segments between the node leaders by MPI, then every other rank of a node pulls
the remote segments from its leader's window by IPC.

Same window layout, seeded data, checks and bandwidth formula as the single-copy
all-gather, so the table compares the two directly.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError
from ..window import Window
from .allgather import AllGather
from .base import SizePlan
from .mpi_path import MpiPath

__all__ = ["HierarchicalAllGather", "bind_hierarchical", "node_segments"]


def node_segments(node_of_rank: list[int]) -> list[tuple[int, int]]:
    """(first rank, rank count) of each node, in node order.

    Raises:
        ConfigError: a node's ranks are not consecutive (a node segment must be one
            contiguous range of the rank-ordered output).
    """
    segments: list[tuple[int, int]] = []
    for node in range(max(node_of_rank) + 1):
        ranks = [r for r, n in enumerate(node_of_rank) if n == node]
        if ranks != list(range(ranks[0], ranks[-1] + 1)):
            raise ConfigError(
                f"the hierarchical all-gather needs each node's ranks to be consecutive; "
                f"node {node} holds ranks {ranks}: place ranks by node (srun "
                "--distribution=block, mpirun --map-by slot or ppr:N:node)")
        segments.append((ranks[0], len(ranks)))
    return segments


def bind_hierarchical(pattern: AllGather, window: Window, plan: SizePlan,
                      mode: str) -> Callable[[], None]:
    """One hierarchical all-gather over ``window`` (a window or a region of one)."""
    world, engine = window.world, window.engine
    block, me = plan.block_bytes, world.rank
    segments = node_segments(world.node_of_rank)
    recv = pattern._recv_offset(plan)
    output = window.local.slice(recv, block * world.size)
    mine = pattern._send_of(window, me, plan, mode)

    # 1. IPC: our block into every local peer's output, staggered like the flat one.
    local = world.local_ranks
    position = local.index(me)
    pairs = []
    for step in range(1, len(local)):
        peer = local[(position + step) % len(local)]
        pairs.append((window.peer(peer).slice(recv + me * block, block), mine))
    if mode == "out-of-place":
        pairs.append((output.slice(me * block, block), mine))
    copy_within_node = engine.copier(pairs)
    node_barrier = window.node_barrier
    if world.node_count == 1:
        def allgather_one_node() -> None:
            node_barrier()  # every local output is free to write
            copy_within_node()
            node_barrier()  # every block of the node has landed
        return allgather_one_node

    # 2. MPI between leaders: each leader's node segment to every other leader.
    exchange: Callable[[], None] | None = None
    if world.is_leader:
        exchange = MpiPath(engine, window.group.backend_name).allgatherv_in_place(
            world.leader_comm, output, [count * block for _, count in segments],
            [first * block for first, _ in segments])
    # 3. IPC: the other ranks pull the remote segments from their leader's output.
    pull = None
    if not world.is_leader:
        leader_output = window.peer(local[0])
        pull = engine.copier([
            (output.slice(first * block, count * block),
             leader_output.slice(recv + first * block, count * block))
            for node, (first, count) in enumerate(segments) if node != world.node_index])
    synchronize = engine.synchronize

    def allgather() -> None:
        node_barrier()  # every local output is free to write
        copy_within_node()
        node_barrier()  # every block of the node has landed
        if exchange is not None:
            synchronize()  # MPI reads what the stream wrote
            exchange()
        node_barrier()  # the leader holds every node's blocks
        if pull is not None:
            pull()
    return allgather


class HierarchicalAllGather(AllGather):
    """``--algo hierarchical``: IPC inside nodes, MPI between node leaders."""

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        return bind_hierarchical(self, window, plan, mode)
