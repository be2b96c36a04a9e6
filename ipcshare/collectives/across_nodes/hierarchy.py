"""The hierarchical collectives' steps, over buffers (``ptr``, ``nbytes``, ``slice``): a
``Communicator`` over the node's ranks for the steps inside the node, and the rails'
engine for the steps between nodes (rail j = local rank j of every node). Used by
``NodesCommunicator`` on the user's arrays and by the harness on window buffers alike.
Nodes hold as many ranks each, their ranks consecutive (one rank of every node per rail).

- all-gather over N nodes of L ranks: rail all-gather of the rank's input (rank (k, j)
  gets block (k', j) of every node k'), node all-gather of those N blocks (local-rank
  major), then a reorder into rank order.
- all-reduce of C elements: reduce-scatter inside the node (local rank j holds the node's
  partial of chunk j, C/L elements), all-reduce of chunk j on rail j, all-gather inside
  the node. When L does not divide C, the last C mod L elements take a node all-reduce
  and a rail all-reduce of their own.
- reduce-scatter of n = N*L blocks: the input's blocks reordered rail-major (block
  node*L + j to position node of chunk j), reduce-scatter inside the node (local rank j
  holds the node's partial of its rail's N blocks), reduce-scatter on rail j (rail rank
  = node, so it gets block node*L + j: its own).

- all-to-all of n = N*L blocks: the input's blocks reordered local-rank major (block
  node*L + j, for rank (node, j), to position j*N + node), an all-to-all inside the node
  of N blocks per rank (local rank j gets, from each local rank i, the N blocks bound
  for rail j), a reorder node-major (from local rank i, block for node b to b*L + i),
  then an all-to-all on the rail of L blocks per node, which lands rank-ordered.

Every element is reduced by one rank per level and then copied, so every rank holds the
same bits. 16-bit sums round once per level (the node's partial, then across nodes): the
same bits on every rank and from run to run, but on data that is not exact in the type
not always the flat communicator's bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...runtime.errors import ConfigError

__all__ = ["node_segments", "Levels", "rail_major_moves",
           "rank_order_moves", "check_even_nodes", "bind_all_gather", "bind_all_reduce",
           "bind_reduce_scatter", "bind_all_to_all", "as_buffer", "typed_view"]


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
                f"the hierarchical collectives need each node's ranks to be consecutive; "
                f"node {node} holds ranks {ranks}: place ranks by node (srun "
                "--distribution=block, mpirun --map-by slot or ppr:N:node)")
        segments.append((ranks[0], len(ranks)))
    return segments


def check_even_nodes(node_of_rank: list[int], what: str) -> int:
    """The ranks per node, when every node holds as many, consecutively.

    Raises:
        ConfigError: nodes of different sizes, or a node whose ranks are not consecutive
            (on every rank: the placement is known job-wide).
    """
    sizes = sorted({count for _first, count in node_segments(node_of_rank)})
    if len(sizes) > 1:
        raise ConfigError(
            f"{what} needs as many ranks on every node (one rank of each node per rail); "
            f"this job's nodes hold {', '.join(map(str, sizes))} ranks: start the same "
            "number of ranks per node")
    return sizes[0]


def rail_major_moves(nodes: int, per_node: int, block: int) -> list[tuple[int, int]]:
    """(destination, source) byte offsets of the ``nodes * per_node`` blocks of ``block``
    bytes when rank-ordered blocks (rank = node * per_node + j) are reordered rail-major:
    chunk j holds the blocks of rail j in node order."""
    return [((j * nodes + node) * block, (node * per_node + j) * block)
            for j in range(per_node) for node in range(nodes)]


def rank_order_moves(nodes: int, per_node: int, block: int) -> list[tuple[int, int]]:
    """(destination, source) byte offsets that put blocks gathered local-rank major
    (block of rank (node, j) at position j * nodes + node) back in rank order: the
    inverse of ``rail_major_moves``."""
    return [(source, target) for target, source in rail_major_moves(nodes, per_node, block)]


class Levels:
    """The node's and the rails' collectives of one binding, on buffers: ``node`` is the
    node's Communicator, ``inter`` the rails' engine, ``engine`` the window engine (on
    the call's stream) that the engine queues on or stages through; ``typed(buffer)``
    makes the array a node call takes (numpy on host, DeviceArray on GPUs)."""

    def __init__(self, node: Any, inter: Any, engine: Any, stream: Any,
                 typed: Callable[[Any], Any], dtype: str, op: str | None) -> None:
        self.node, self.inter, self.engine, self.stream = node, inter, engine, stream
        self.typed, self.dtype, self.op = typed, dtype, op
        self.memory = node.memory
        # A host-blocking engine reads device memory as it is: the stream must have run.
        self.settle = (engine.synchronize if not inter.stream_ordered and self.memory != "host"
                       else _nothing)

    def node_reduce_scatter(self, output: Any, input: Any) -> Callable[[], None]:
        node, op, stream = self.node, self.op, self.stream
        out, inp = self.typed(output), self.typed(input)
        return lambda: node.reduce_scatter(out, inp, op=op, stream=stream)

    def node_all_gather(self, output: Any, input: Any) -> Callable[[], None]:
        node, stream = self.node, self.stream
        out, inp = self.typed(output), self.typed(input)
        return lambda: node.all_gather(out, inp, stream=stream)

    def node_all_reduce(self, output: Any, input: Any) -> Callable[[], None]:
        node, op, stream = self.node, self.op, self.stream
        out, inp = self.typed(output), self.typed(input)
        if output.ptr == input.ptr:
            return lambda: node.all_reduce(inp, op=op, stream=stream)
        return lambda: node.all_reduce(inp, op=op, output=out, stream=stream)

    def node_all_to_all(self, output: Any, input: Any) -> Callable[[], None]:
        node, stream = self.node, self.stream
        out, inp = self.typed(output), self.typed(input)
        return lambda: node.all_to_all(out, inp, stream=stream)

    def rail_all_to_all(self, output: Any, input: Any) -> Callable[[], None]:
        return self._settled(self.inter.all_to_all(self.engine, output, input))

    def rail_all_reduce(self, buffer: Any) -> Callable[[], None]:
        return self._settled(self.inter.all_reduce(self.engine, buffer, self.dtype, self.op))

    def rail_reduce_scatter(self, output: Any, input: Any) -> Callable[[], None]:
        return self._settled(self.inter.reduce_scatter(self.engine, output, input, self.dtype,
                                                       self.op))

    def rail_all_gather(self, output: Any, block: int) -> Callable[[], None]:
        rails = output.nbytes // block
        return self._settled(self.inter.allgatherv_in_place(
            self.engine, output, [block] * rails, [r * block for r in range(rails)]))

    def copier(self, target: Any, source: Any, moves: list[tuple[int, int]],
               nbytes: int) -> Callable[[], None]:
        """Copies of ``nbytes`` at each (target offset, source offset) of ``moves``: numpy
        on host, the window engine's copies (stream-ordered) on GPUs."""
        if self.memory == "host":
            into = np.asarray(as_buffer(target)).view(np.uint8).reshape(-1)
            src = np.asarray(as_buffer(source)).view(np.uint8).reshape(-1)
            pairs = [(into[t:t + nbytes], src[s:s + nbytes]) for t, s in moves]

            def copy_host() -> None:
                for destination, data in pairs:
                    destination[:] = data
            return copy_host
        return self.engine.copier([(target.slice(t, nbytes), source.slice(s, nbytes))
                                   for t, s in moves])

    def _settled(self, run: Callable[[], None]) -> Callable[[], None]:
        settle = self.settle

        def rail_step() -> None:
            settle()
            run()
        return rail_step


def bind_all_gather(levels: Levels, input: Any, output: Any, *, nodes: int, per_node: int,
                    node_index: int) -> Callable[[], None]:
    """All-gather of ``input`` (``block`` bytes) into ``output`` (rank order), through two
    arrays of the node communicator's heap (freed when the returned callable goes)."""
    block = input.nbytes
    node = levels.node
    rail = as_buffer(node.empty((nodes * block,), "uint8"))         # block (k', j), k' = 0..N-1
    gathered = as_buffer(node.empty((per_node * nodes * block,), "uint8"))  # [j][k'][block]
    own = levels.copier(rail, input, [(node_index * block, 0)], block)
    exchange = levels.rail_all_gather(rail, block)
    node_step = levels.node_all_gather(gathered, rail)
    # gathered[j][k] -> output[k][j]: the inverse of the rail-major order.
    reorder = levels.copier(output, gathered, rank_order_moves(nodes, per_node, block), block)
    keep = (rail, gathered)

    def hierarchical_all_gather() -> None:
        assert keep
        own()
        exchange()
        node_step()
        reorder()
    return hierarchical_all_gather


def bind_all_reduce(levels: Levels, inputs: Any, output: Any, *, element: int,
                    in_place: bool) -> Callable[[], None]:
    """All-reduce of ``inputs`` into ``output`` (the same buffer when ``in_place``)."""
    local, me = levels.node.size, levels.node.rank
    nbytes = output.nbytes
    count = nbytes // element
    chunk = count // local
    head = chunk * local * element
    parts: list[Callable[[], None]] = []
    if chunk:
        mine = output.slice(me * chunk * element, chunk * element)
        parts += [levels.node_reduce_scatter(mine, inputs.slice(0, head)),
                  levels.rail_all_reduce(mine),
                  levels.node_all_gather(output.slice(0, head), mine)]
    if head < nbytes:  # the elements L does not divide: reduced whole, at both levels
        tail = output.slice(head, nbytes - head)
        parts += [levels.node_all_reduce(tail, tail if in_place else
                                         inputs.slice(head, nbytes - head)),
                  levels.rail_all_reduce(tail)]

    def hierarchical_all_reduce() -> None:
        for part in parts:
            part()
    return hierarchical_all_reduce


def bind_reduce_scatter(levels: Levels, inputs: Any, output: Any, *, element: int,
                        nodes: int) -> Callable[[], None]:
    """Reduce-scatter of ``inputs`` (the ranks times ``output.nbytes``) into ``output``,
    through two arrays of the node communicator's heap."""
    node = levels.node
    per_node = node.size
    block = output.nbytes
    # Scratch in the node communicator's heap: arrays from empty() are read in place.
    reordered = node.empty((inputs.nbytes // element,), levels.dtype)
    partial = node.empty((nodes * block // element,), levels.dtype)
    reorder = levels.copier(as_buffer(reordered), inputs,
                            rail_major_moves(nodes, per_node, block), block)
    node_step = levels.node_reduce_scatter(as_buffer(partial), as_buffer(reordered))
    rail_step = levels.rail_reduce_scatter(output, as_buffer(partial))
    keep = (reordered, partial)  # the heap arrays live as long as the operation

    def hierarchical_reduce_scatter() -> None:
        assert keep
        reorder()
        node_step()
        rail_step()
    return hierarchical_reduce_scatter


def bind_all_to_all(levels: Levels, input: Any, output: Any, *, nodes: int,
                    per_node: int) -> Callable[[], None]:
    """All-to-all of ``input`` (the ranks times a block of bytes) into ``output`` (as
    long; may be ``input``: the input is read whole before the output is written),
    through two arrays of the node communicator's heap."""
    node = levels.node
    block = input.nbytes // (nodes * per_node)
    # [j][node]: the blocks bound for rail j, by node; then [i][node] as received from
    # local rank i; then [node][i], what rail rank `node` gets.
    local_major = as_buffer(node.empty((input.nbytes,), "uint8"))
    received = as_buffer(node.empty((input.nbytes,), "uint8"))
    by_rail = levels.copier(local_major, input, rail_major_moves(nodes, per_node, block),
                            block)
    node_step = levels.node_all_to_all(received, local_major)
    by_node = levels.copier(local_major, received, rank_order_moves(nodes, per_node, block),
                            block)
    rail_step = levels.rail_all_to_all(output, local_major)
    keep = (local_major, received)

    def hierarchical_all_to_all() -> None:
        assert keep
        by_rail()
        node_step()
        by_node()
        rail_step()
    return hierarchical_all_to_all


def typed_view(buffer: Any, memory: str, dtype: str) -> Any:
    """``buffer`` as a 1-D array of ``dtype`` that a node call takes: a numpy view on host
    memory, a DeviceArray on GPUs (bfloat16 needs no ml_dtypes there)."""
    if memory == "host":
        from ..arrays import to_numpy_dtype

        return np.asarray(buffer).view(to_numpy_dtype(dtype))
    from ...backends.device_buffer import DeviceArray

    return DeviceArray.viewing(buffer, dtype)


def as_buffer(array: Any) -> Any:
    """An array (from ``empty()``, or the user's) as a buffer (``ptr``, ``nbytes``,
    ``slice``): device buffers are one; numpy arrays are wrapped."""
    if isinstance(array, np.ndarray):
        return HostBytes(array)
    return array


class HostBytes:
    """A numpy array seen as a buffer: its bytes, ``ptr``, ``nbytes`` and ``slice``."""

    def __init__(self, array: np.ndarray) -> None:
        self._bytes = array.reshape(-1).view(np.uint8)
        self.ptr = array.ctypes.data
        self.nbytes = array.nbytes

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._bytes

    def slice(self, offset: int, nbytes: int) -> HostBytes:
        return HostBytes(self._bytes[offset:offset + nbytes])


def _nothing() -> None:
    return None
