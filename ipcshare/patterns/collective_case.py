"""What the all-reduce and reduce-scatter cases share: they call the library's
``Communicator`` on arrays laid out in the driver's window (arrays of the user's, to the
library: copied in), with seeded small integers whose reductions are exact in every type,
so every algorithm and summation order must give the same bits."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import numpy as np

from ..collectives.across_nodes.hierarchy import typed_view
from ..collectives.reduction import REDUCE_DTYPES, REDUCE_OPS, float32_to_bfloat16
from ..runtime.errors import ConfigError
from ..window import Window
from .base import Pattern, SizePlan, align
from .seeding import count_wrong, poison, seeded_small_integers

__all__ = ["CommunicatorCase", "exact_bytes", "communicator_for", "refuse_registered_across_nodes",
           "register_window"]


def communicator_for(current: Any, window: Window, nbytes: int, heap_bytes: int = 0,
                     inter: str = "auto") -> Any:
    """``current`` (a Communicator or None) if it takes calls of ``nbytes`` with a heap of
    ``heap_bytes`` (default none), else a new one of the window's group sized for them,
    ``current`` closed: a sweep grows it at the first bind of each larger size and never
    keeps it larger. ``inter``: the engine between nodes of a group spanning them."""
    if (current is not None and not current.closed and current.max_bytes >= nbytes
            and current.heap_bytes >= heap_bytes):
        return current
    if current is not None:
        current.close()
    return window.group.communicator(max_bytes=nbytes, heap_bytes=heap_bytes, inter=inter)


def refuse_registered_across_nodes(window: Window) -> None:
    """-R 1 on a job spanning nodes: a communicator of one node registers arrays.

    Raises:
        ConfigError: the job spans nodes.
    """
    if window.world.node_count > 1:
        raise ConfigError("-R 1 registers arrays with a communicator of one node; "
                          f"this job spans {window.world.node_count} nodes: use -R 0")


def register_window(communicator: Any, window: Window, dtype: str) -> None:
    """-R 1: register the driver's whole window (its regions and views share it: every
    array of every size and mode lies in it) with ``communicator``, which holds it until
    it closes."""
    base = getattr(window, "window", None) or window
    communicator.register(typed_view(base.local, communicator.memory, dtype))


def exact_bytes(values: np.ndarray, datatype: str) -> np.ndarray:
    """Small integers (int64) as ``datatype`` elements, as bytes (exact: |v| <= 256)."""
    if datatype == "int32":
        typed = values.astype(np.int32)
    elif datatype == "bfloat16":
        typed = float32_to_bfloat16(values.astype(np.float32))
    else:
        typed = values.astype(np.float32).astype(np.dtype(datatype))
    return typed.view(np.uint8)


class CommunicatorCase(Pattern):
    """A reduction collective of the library as an nccl-tests case. Subclasses say which
    (``collective``), how sizes map to input and output (``plan``, ``output_bytes``),
    where in place puts the output (``in_place_offset``), the bus factor, and what this
    rank's output must hold (``expected``).

    Window layout per rank: [input][pad to 4 KiB][output]; in place the output is
    inside the input. The communicator (sized for the plan, no heap) is made at the
    first bind of each larger plan and replaced, never kept larger than needed.
    """

    modes = ("out-of-place", "in-place")
    collective = ""
    warm_before_capture = True

    def __init__(self, algo: str = "auto", *, op: str = "sum",
                 datatype: str = "float32") -> None:
        if op not in REDUCE_OPS:
            raise ConfigError(f"unknown reduction op {op!r}; choose one of: "
                              f"{', '.join(REDUCE_OPS)}")
        if datatype not in REDUCE_DTYPES:
            raise ConfigError(f"the {self.name} op reduces {', '.join(REDUCE_DTYPES)}, "
                              f"not -d {datatype}")
        self.algo = algo
        self.op = op
        self.datatype = datatype
        self._communicator: Any = None
        self._node_group: Any = None  # the node's ranks, when the job spans nodes
        # -R 1: the driver's window is registered with each communicator made (held until
        # that communicator closes), so calls read their arrays in place.
        self.register = False
        self._registered_with: Any = None

    # -- what subclasses say -----------------------------------------------------------
    @abc.abstractmethod
    def output_bytes(self, plan: SizePlan, world_size: int) -> int:
        """Bytes of each rank's output."""

    @abc.abstractmethod
    def in_place_offset(self, plan: SizePlan, rank: int, world_size: int) -> int:
        """Where in its input the output of ``rank`` lies when in place."""

    @abc.abstractmethod
    def expected(self, reduced: np.ndarray, plan: SizePlan, rank: int,
                 world_size: int) -> np.ndarray:
        """This rank's part of ``reduced`` (the whole reduction, as small integers)."""

    @abc.abstractmethod
    def call(self, communicator: Any, inputs: Any, output: Any, *, in_place: bool,
             stream: Any) -> Callable[[], None]:
        """One operation of the library on ``inputs`` and ``output`` (arrays over the
        window: numpy on host, DeviceArray on GPUs; in place, ``output`` lies inside
        ``inputs``), on ``stream`` (None on host), bound once (``Communicator.bind``), so
        the figures are those of a loop calling a bound collective."""

    # -- the Pattern interface ---------------------------------------------------------
    def window_bytes(self, plan: SizePlan, world_size: int) -> int:
        return align(plan.size) + self.output_bytes(plan, world_size)

    def _output(self, window: Window, plan: SizePlan, mode: str) -> Any:
        n = window.world_size
        if mode == "in-place":
            return window.local.slice(self.in_place_offset(plan, window.rank, n),
                                      self.output_bytes(plan, n))
        return window.local.slice(align(plan.size), self.output_bytes(plan, n))

    def prepare(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> None:
        engine = window.engine
        if mode == "out-of-place":
            output = self._output(window, plan, mode)
            engine.upload(output, poison(output.nbytes))
        engine.upload(window.local.slice(0, plan.size),
                      self.input_bytes(plan, window.rank, window.world_size, iteration))

    @property
    def library_algo(self) -> str:
        """The library's name for ``algo`` (hierarchical is auto on one node)."""
        return "auto" if self.algo == "hierarchical" else self.algo

    def node_communicator(self, group: Any, plan: SizePlan) -> Any:
        """Collective over ``group``'s node: a communicator over the node's ranks for the
        hierarchical collectives, sized for ``plan`` (made at the first bind of each
        larger plan, on a node group made once)."""
        from .hierarchical_reduction import node_heap_bytes

        if self._node_group is None:
            self._node_group = group.node_group()
        communicator = self._communicator
        if communicator is None or communicator.closed or communicator.max_bytes < plan.size:
            if communicator is not None:
                communicator.close()
            communicator = self._communicator = self._node_group.communicator(
                max_bytes=plan.size, heap_bytes=node_heap_bytes(self.collective, plan))
        return communicator

    def close(self) -> None:
        """Collective: close the node group of the hierarchical collectives (with its
        communicator) and the engine between nodes. Idempotent."""
        node_group, self._node_group = self._node_group, None
        try:
            if node_group is not None:
                self._communicator = None
                node_group.close()
        finally:
            super().close()

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        if window.world.node_count > 1:
            if self.register:
                refuse_registered_across_nodes(window)
            from .hierarchical_reduction import bind_hierarchical_reduction

            return bind_hierarchical_reduction(self, window, plan, mode)
        communicator = self._communicator = communicator_for(self._communicator, window,
                                                             plan.size)
        if self.register and self._registered_with is not communicator:
            register_window(communicator, window, self.datatype)
            self._registered_with = communicator
        inputs = self._typed(window.local.slice(0, plan.size), communicator.memory)
        output = self._typed(self._output(window, plan, mode), communicator.memory)
        # On GPUs the collective runs on the window's stream, after the driver's uploads.
        stream = None if communicator.memory == "host" else window.engine.stream
        return self.call(communicator, inputs, output, in_place=mode == "in-place",
                         stream=stream)

    def _typed(self, buffer: Any, memory: str) -> Any:
        """``buffer`` as an array of the case's dtype: numpy on host, a DeviceArray on
        GPUs (bfloat16 needs no ml_dtypes there)."""
        return typed_view(buffer, memory, self.datatype)

    def check(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> int:
        if self._communicator is not None and self._communicator.memory != "host":
            # A kernel that gave up, or ranks that disagreed, raise here with the cause.
            self._communicator.synchronize(window.engine.stream)
        got = window.engine.download(self._output(window, plan, mode))
        want = self.expected_bytes(plan, window.rank, window.world_size, iteration)
        return count_wrong(got, want, plan.element_size)

    # -- data, for this case and its baselines ------------------------------------------
    def input_bytes(self, plan: SizePlan, rank: int, world_size: int, iteration: int,
                    ) -> np.ndarray:
        """Rank ``rank``'s seeded input of ``iteration``, as bytes."""
        values = seeded_small_integers(iteration, rank, plan.size // plan.element_size,
                                       world_size)
        return exact_bytes(values, self.datatype)

    def expected_bytes(self, plan: SizePlan, rank: int, world_size: int, iteration: int,
                       ) -> np.ndarray:
        """What rank ``rank``'s output must hold after ``iteration``, as bytes."""
        count = plan.size // plan.element_size
        values = [seeded_small_integers(iteration, r, count, world_size)
                  for r in range(world_size)]
        if self.op == "sum":
            reduced = np.sum(values, axis=0)
        else:
            reduced = (np.max if self.op == "max" else np.min)(values, axis=0)
        return exact_bytes(self.expected(reduced, plan, rank, world_size), self.datatype)
