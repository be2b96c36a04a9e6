"""Hierarchical all-gather for jobs that span nodes: IPC inside each node, an engine
between nodes (``--inter``: NCCL through nccl4py, or MPI; collectives.across_nodes.choice). With
nodes of equal size every rank exchanges its block with its counterparts on the other
nodes (one "rail" per local rank) and pushes what it got to its node's peers; with uneven
nodes the node leaders exchange node segments and the other ranks pull them from their
leader's window.

Same window layout, seeded data, checks and bandwidth formula as the single-copy
all-gather, so the table compares the two directly (``--algo hierarchical`` is
allgather_hierarchical.HierarchicalAllGather; ``auto`` binds here when a job spans nodes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..collectives.across_nodes.engine import InterNodeEngine
from ..collectives.across_nodes.hierarchy import node_segments
from ..runtime.errors import ConfigError
from ..window import Window
from .base import SizePlan

__all__ = ["bind_hierarchical"]


class AllGatherRegions(Protocol):
    """Where an all-gather pattern keeps its blocks in a window (patterns.allgather
    fills it in and binds through here when a job spans nodes)."""

    def _recv_offset(self, plan: SizePlan) -> int: ...

    def _send_of(self, window: Window, rank: int, plan: SizePlan, mode: str) -> Any: ...

    def inter_engine(self, group: Any) -> InterNodeEngine: ...


def bind_hierarchical(pattern: AllGatherRegions, window: Window, plan: SizePlan,
                      mode: str) -> Callable[[], None]:
    """One hierarchical all-gather over ``window`` (a window or a region of one): by
    rails when every node has as many ranks, through the node leaders otherwise."""
    world, engine = window.world, window.engine
    block, me = plan.block_bytes, world.rank
    if window.fallbacks_anywhere:  # known job-wide: every rank refuses alike
        raise ConfigError(
            "the hierarchical all-gather maps every peer of a node, but some node has GPUs "
            "without peer access (see `ipcshare info`): place such GPUs on different "
            "(virtual) nodes, or run the job on one node with --algo copy-engine")
    segments = node_segments(world.node_of_rank)
    recv = pattern._recv_offset(plan)
    output = window.local.slice(recv, block * world.size)
    mine = pattern._send_of(window, me, plan, mode)
    # IPC: our block into every local peer's output, staggered like the flat one; out of
    # place also into our own slot, where MPI then finds it.
    pairs = [(window.peer(peer).slice(recv + me * block, block), mine)
             for peer in _local_peers(world)]
    if mode == "out-of-place":
        pairs.append((output.slice(me * block, block), mine))
    copy_own = engine.copier(pairs)
    node_barrier = window.node_barrier
    if world.node_count == 1:
        def allgather_one_node() -> None:
            node_barrier()  # every local output is free to write
            copy_own()
            node_barrier()  # every block of the node has landed
        return allgather_one_node
    inter = pattern.inter_engine(window.group)
    if len({count for _, count in segments}) == 1:
        return _by_rails(window, segments, block, recv, output, copy_own, inter)
    return _through_leaders(window, segments, block, recv, output, copy_own, inter)


def _local_peers(world) -> list[int]:
    """The other ranks of this node, starting after this one (spreads the traffic)."""
    local = world.local_ranks
    position = local.index(world.rank)
    return [local[(position + step) % len(local)] for step in range(1, len(local))]


def _by_rails(window: Window, segments: list[tuple[int, int]], block: int, recv: int,
              output, copy_own: Callable[[], None],
              inter: InterNodeEngine) -> Callable[[], None]:
    """Nodes of L ranks each: local rank j of every node swaps blocks with local rank j of
    the others (an all-gather on rail j, straight into the output), then pushes what it
    got to its node's peers. Every rank crosses nodes and every rank copies."""
    world, engine = window.world, window.engine
    per_node, j = segments[0][1], world.local_rank
    remote = [(node * per_node + j) * block for node in range(world.node_count)
              if node != world.node_index]
    exchange = inter.allgatherv_in_place(
        engine, output, [block] * world.node_count,
        [(node * per_node + j) * block for node in range(world.node_count)])
    peers = _local_peers(world)
    copy_remote = engine.copier([
        (window.peer(peer).slice(recv + offset, block), output.slice(offset, block))
        for offset in remote for peer in peers])
    node_barrier = window.node_barrier
    # A host-blocking engine reads memory as it is: the stream must have written it.
    synchronize = _nothing if inter.stream_ordered else engine.synchronize

    def allgather() -> None:
        node_barrier()  # every local output is free to write
        copy_own()
        synchronize()   # the engine reads our own slot
        exchange()
        copy_remote()
        node_barrier()  # every block has landed everywhere on the node
    return allgather


def _through_leaders(window: Window, segments: list[tuple[int, int]], block: int,
                     recv: int, output, copy_own: Callable[[], None],
                     inter: InterNodeEngine) -> Callable[[], None]:
    """Nodes of different sizes: the node's blocks by IPC, node segments between the
    leaders by an all-gather on rail 0, then the other ranks pull the remote segments
    from their leader's output by IPC."""
    world, engine = window.world, window.engine
    exchange = pull = None
    if world.is_leader:
        exchange = inter.allgatherv_in_place(
            engine, output, [count * block for _, count in segments],
            [first * block for first, _ in segments])
    else:
        leader_output = window.peer(world.local_ranks[0])
        pull = engine.copier([
            (output.slice(first * block, count * block),
             leader_output.slice(recv + first * block, count * block))
            for node, (first, count) in enumerate(segments) if node != world.node_index])
    node_barrier = window.node_barrier
    synchronize = _nothing if inter.stream_ordered else engine.synchronize

    def allgather() -> None:
        node_barrier()  # every local output is free to write
        copy_own()
        node_barrier()  # every block of the node has landed
        if exchange is not None:
            synchronize()  # a host-blocking engine reads what the stream wrote
            exchange()
        node_barrier()  # the leader holds every node's blocks
        if pull is not None:
            pull()
    return allgather


def _nothing() -> None:
    return None
