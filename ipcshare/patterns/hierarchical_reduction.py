"""All-reduce and reduce-scatter for jobs that span nodes, built from the library's
collectives inside each node (a ``Communicator`` over the node's ranks) and the rails'
collectives between nodes (the ``--inter`` engine; rail j = local rank j of every node).
Nodes must hold as many ranks each (one rank per node on every rail).

- all-reduce of C elements over N nodes of L ranks: reduce-scatter inside the node (local
  rank j holds the node's partial of chunk j, C/L elements), all-reduce of chunk j on rail
  j, all-gather inside the node. When L does not divide C, the last C mod L elements take
  a node all-reduce and a rail all-reduce of their own.
- reduce-scatter of n = N*L blocks: the input's blocks reordered rail-major (block
  node*L + j to position node of chunk j), reduce-scatter inside the node (local rank j
  holds the node's partial of its rail's N blocks), reduce-scatter on rail j (rail rank
  = node, so it gets block node*L + j: its own).

Every element is reduced by one rank per level and then copied, so every rank holds the
same bits. 16-bit sums round once per level (the node's partial, then across nodes): the
same bits on every rank and from run to run, but on data that is not exact in the type
not always the flat communicator's bits (the seeded data of the cases are exact).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..collectives.scratch import ALIGN
from ..errors import ConfigError
from ..window import Group, Window
from .allgather_across_nodes import node_segments
from .base import SizePlan

__all__ = ["bind_hierarchical_reduction", "open_node_group", "rail_major_moves",
           "node_heap_bytes"]

_ONE_NODE_ALGOS = ("one-shot", "two-shot")


def open_node_group(group: Group) -> Group:
    """Collective: a group of this rank's node (its ranks only), on the same backend and
    GPU as ``group``."""
    world = group.world
    return Group(group.backend_name, group.exchange_name, comm=world.local_comm,
                 host_placement=(world.host_rank, world.host_size))


def node_heap_bytes(collective: str, plan: SizePlan) -> int:
    """Heap the node communicator needs for ``collective`` at ``plan``: the reduce-scatter
    keeps its reordered input and the node's partial there, for two bindings at once
    (the driver binds the in-place mode while the out-of-place one is still held)."""
    if collective != "reduce_scatter":
        return 0
    return 2 * (2 * plan.size + 2 * ALIGN)


def rail_major_moves(nodes: int, per_node: int, block: int) -> list[tuple[int, int]]:
    """(destination, source) byte offsets of the ``nodes * per_node`` blocks of ``block``
    bytes when rank-ordered blocks (rank = node * per_node + j) are reordered rail-major:
    chunk j holds the blocks of rail j in node order."""
    return [((j * nodes + node) * block, (node * per_node + j) * block)
            for j in range(per_node) for node in range(nodes)]


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
    sizes = sorted({count for _first, count in node_segments(world.node_of_rank)})
    if len(sizes) > 1:
        raise ConfigError(
            f"the hierarchical {case.name} needs as many ranks on every node (one rank of "
            f"each node per rail); this job's nodes hold {', '.join(map(str, sizes))} ranks: "
            "start the same number of ranks per node")
    communicator = case.node_communicator(window.group, plan)
    inter = case.inter_engine(window.group)
    if getattr(window, "graph_safe", False) and not inter.stream_ordered:
        raise ConfigError(f"--graph across nodes needs --inter nccl: the {inter.name} engine "
                          "waits on the host, which a CUDA graph cannot replay")
    memory = communicator.memory
    stream = None if memory == "host" else window.engine.stream
    # A host-blocking engine reads device memory as it is: the stream must have run.
    settle = window.engine.synchronize if not inter.stream_ordered and memory != "host" \
        else _nothing
    n = window.world_size
    inputs = window.local.slice(0, plan.size)
    output = case._output(window, plan, mode)
    steps = _Steps(case, communicator, inter, window.engine, stream, settle)
    if case.collective == "all_reduce":
        return _all_reduce(steps, inputs, output, plan, in_place=mode == "in-place")
    return _reduce_scatter(steps, communicator, inputs, output, plan, n, world.node_count)


class _Steps:
    """The node's and the rails' collectives of one binding, on typed arrays over window
    buffers (numpy on host, DeviceArray on GPUs)."""

    def __init__(self, case: Any, communicator: Any, inter: Any, engine: Any, stream: Any,
                 settle: Callable[[], None]) -> None:
        self.case, self.communicator, self.inter = case, communicator, inter
        self.engine, self.stream, self.settle = engine, stream, settle
        self.dtype, self.op = case.datatype, case.op

    def typed(self, buffer: Any) -> Any:
        return self.case._typed(buffer, self.communicator.memory)

    def node_reduce_scatter(self, output: Any, input: Any) -> Callable[[], None]:
        comm, op, stream = self.communicator, self.op, self.stream
        out, inp = self.typed(output), self.typed(input)
        return lambda: comm.reduce_scatter(out, inp, op=op, stream=stream)

    def node_all_gather(self, output: Any, input: Any) -> Callable[[], None]:
        comm, stream = self.communicator, self.stream
        out, inp = self.typed(output), self.typed(input)
        return lambda: comm.all_gather(out, inp, stream=stream)

    def node_all_reduce(self, output: Any, input: Any) -> Callable[[], None]:
        comm, op, stream = self.communicator, self.op, self.stream
        out, inp = self.typed(output), self.typed(input)
        if output.ptr == input.ptr:
            return lambda: comm.all_reduce(inp, op=op, stream=stream)
        return lambda: comm.all_reduce(inp, op=op, output=out, stream=stream)

    def rail_all_reduce(self, buffer: Any) -> Callable[[], None]:
        run, settle = self.inter.all_reduce(self.engine, buffer, self.dtype, self.op), \
            self.settle

        def rail_all_reduce() -> None:
            settle()
            run()
        return rail_all_reduce

    def rail_reduce_scatter(self, output: Any, input: Any) -> Callable[[], None]:
        run = self.inter.reduce_scatter(self.engine, output, input, self.dtype, self.op)
        settle = self.settle

        def rail_reduce_scatter() -> None:
            settle()
            run()
        return rail_reduce_scatter


def _all_reduce(steps: _Steps, inputs: Any, output: Any, plan: SizePlan, *,
                in_place: bool) -> Callable[[], None]:
    local = steps.communicator.size
    me = steps.communicator.rank
    element = plan.element_size
    count = plan.size // element
    chunk = count // local
    head = chunk * local * element
    parts: list[Callable[[], None]] = []
    if chunk:
        mine = output.slice(me * chunk * element, chunk * element)
        parts += [steps.node_reduce_scatter(mine, inputs.slice(0, head)),
                  steps.rail_all_reduce(mine),
                  steps.node_all_gather(output.slice(0, head), mine)]
    if head < plan.size:  # the elements L does not divide: reduced whole, at both levels
        tail = output.slice(head, plan.size - head)
        parts += [steps.node_all_reduce(tail, tail if in_place else
                                        inputs.slice(head, plan.size - head)),
                  steps.rail_all_reduce(tail)]

    def hierarchical_all_reduce() -> None:
        for part in parts:
            part()
    return hierarchical_all_reduce


def _reduce_scatter(steps: _Steps, communicator: Any, inputs: Any, output: Any,
                    plan: SizePlan, n: int, nodes: int) -> Callable[[], None]:
    per_node = n // nodes
    block = output.nbytes
    dtype = steps.dtype
    # Scratch in the node communicator's heap: arrays from empty() are read in place.
    reordered = communicator.empty((plan.size // plan.element_size,), dtype)
    partial = communicator.empty((nodes * block // plan.element_size,), dtype)
    reorder = _byte_copier(steps.engine, communicator.memory, reordered, inputs,
                           rail_major_moves(nodes, per_node, block), block)
    node_step = steps.node_reduce_scatter(_as_buffer(partial), _as_buffer(reordered))
    rail_step = steps.rail_reduce_scatter(output, _as_buffer(partial))
    keep = (reordered, partial)  # the heap arrays live as long as the operation

    def hierarchical_reduce_scatter() -> None:
        assert keep
        reorder()
        node_step()
        rail_step()
    return hierarchical_reduce_scatter


def _as_buffer(array: Any) -> Any:
    """An array from ``empty()`` as a window-like buffer (``ptr``, ``nbytes``,
    ``slice``): DeviceArrays are one; numpy arrays are wrapped."""
    if isinstance(array, np.ndarray):
        return _HostBytes(array)
    return array


class _HostBytes:
    """A numpy array seen as a buffer: its bytes, ``ptr``, ``nbytes`` and ``slice``."""

    def __init__(self, array: np.ndarray) -> None:
        self._bytes = array.view(np.uint8).reshape(-1)
        self.ptr = array.ctypes.data
        self.nbytes = array.nbytes

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._bytes

    def slice(self, offset: int, nbytes: int) -> _HostBytes:
        return _HostBytes(self._bytes[offset:offset + nbytes])


def _byte_copier(engine: Any, memory: str, target: Any, source: Any,
                 moves: list[tuple[int, int]], nbytes: int) -> Callable[[], None]:
    """A callable copying ``nbytes`` at each (target offset, source offset) of
    ``moves``: numpy on host, the window engine's copies on GPUs."""
    if memory == "host":
        into = np.asarray(_as_buffer(target)).view(np.uint8).reshape(-1)
        src = np.asarray(source).view(np.uint8).reshape(-1)
        pairs = [(into[t:t + nbytes], src[s:s + nbytes]) for t, s in moves]

        def copy_host() -> None:
            for destination, data in pairs:
                destination[:] = data
        return copy_host
    return engine.copier([(target.slice(t, nbytes), source.slice(s, nbytes))
                          for t, s in moves])


def _nothing() -> None:
    return None
