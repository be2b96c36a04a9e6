"""All-reduce and reduce-scatter cases for jobs that span nodes: the library's
hierarchical steps (collectives.across_nodes.hierarchy) over the case's window buffers,
with a node communicator the case keeps and the ``--inter`` engine between nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..collectives.across_nodes.hierarchy import (
    Levels,
    bind_all_reduce,
    bind_reduce_scatter,
    check_even_nodes,
)
from ..collectives.scratch import ALIGN
from ..runtime.errors import ConfigError
from ..window import Window
from .base import SizePlan

__all__ = ["bind_hierarchical_reduction", "node_heap_bytes"]

_ONE_NODE_ALGOS = ("one-shot", "two-shot")


def node_heap_bytes(collective: str, plan: SizePlan) -> int:
    """Heap the node communicator needs for ``collective`` at ``plan``: the reduce-scatter
    keeps its reordered input and the node's partial there, for two bindings at once
    (the driver binds the in-place mode while the out-of-place one is still held)."""
    if collective != "reduce_scatter":
        return 0
    return 2 * (2 * plan.size + 2 * ALIGN)


def bind_hierarchical_reduction(case: Any, window: Window, plan: SizePlan,
                                mode: str) -> Callable[[], None]:
    """One hierarchical all-reduce or reduce-scatter of ``case`` (a CommunicatorCase)
    over ``window``, its input and output where the flat case keeps them.

    Raises:
        ConfigError: a one-node algorithm asked for, nodes of different rank counts, or
            CUDA-graph capture with a host-blocking engine (on every rank: all are known
            job-wide).
    """
    world = window.world
    if case.algo in _ONE_NODE_ALGOS:
        raise ConfigError(f"--algo {case.algo} runs within one node; this job spans "
                          f"{world.node_count} nodes: use --algo hierarchical (or auto)")
    check_even_nodes(world.node_of_rank, f"the hierarchical {case.name}")
    communicator = case.node_communicator(window.group, plan)
    inter = case.inter_engine(window.group)
    if getattr(window, "graph_safe", False) and not inter.stream_ordered:
        raise ConfigError(f"--graph across nodes needs --inter nccl: the {inter.name} engine "
                          "waits on the host, which a CUDA graph cannot replay")
    memory = communicator.memory
    stream = None if memory == "host" else window.engine.stream
    levels = Levels(communicator, inter, window.engine, stream,
                    lambda buffer: case._typed(buffer, memory), case.datatype, case.op)
    inputs = window.local.slice(0, plan.size)
    output = case._output(window, plan, mode)
    if case.collective == "all_reduce":
        return bind_all_reduce(levels, inputs, output, element=plan.element_size,
                               in_place=mode == "in-place")
    return bind_reduce_scatter(levels, inputs, output, element=plan.element_size,
                               nodes=world.node_count)
