"""nccl-tests' all-to-all, run by the library's ``Communicator.all_to_all`` (``--splits
even``) or ``all_to_all_v`` (``random``, ``skewed``: uneven splits, zero-size ones among
them), on host memory and on GPUs (there all-to-all-v takes its splits as device
arrays, as a mixture-of-experts layer does, so CUDA graphs time what users capture), in
one node or across nodes (all-to-all only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..collectives.across_nodes.hierarchy import typed_view
from ..runtime.config import DATATYPES, SPLITS
from ..runtime.errors import ConfigError
from ..window import Window
from .allgather import allgather_busbw_factor
from .base import Pattern, SizePlan, align
from .collective_case import communicator_for, refuse_registered_across_nodes, register_window
from .seeding import count_wrong, poison, seeded_bytes

__all__ = ["AllToAll", "split_matrix", "busiest_link_bytes", "LINK_BOUND_GBPS"]

# What the random and skewed splits are drawn from, with the row's element count and the
# world size: every rank draws every rank's splits alike.
SPLITS_SEED = 37
# Random splits: the share of zero-size splits among the others.
_ZERO_SHARE = 0.25
# One count of a device split array (int64).
_SPLIT_BYTES = 8
# What copies reach over one GPU's NVLink on the reference nodes (370-390 GB/s per
# direction, ../docs/GPU.md and the nodes' measurements): an all-to-all cannot beat its
# busiest link's bytes at this speed, the bound each GPU row is given as a fraction of.
LINK_BOUND_GBPS = 370.0
# Heap bytes a communicator spanning nodes adds for its scratch arrays' alignment: two
# per bound call, bound calls per region (at most 64) and mode.
_SCRATCH_SLACK = 2 * 64 * 2 * 256


def split_matrix(splits: str, count: int, world_size: int, seed: int = SPLITS_SEED,
                 ) -> np.ndarray:
    """``m[r, q]``: the elements rank r sends rank q when each rank sends all ``count``
    elements of its input (every row adds up to ``count``), drawn from (``count``,
    ``world_size``, ``seed``) alone, so every rank computes every rank's row alike.
    ``even``: ``count / world_size`` each; ``random``: random shares, about a quarter of
    them zero; ``skewed``: every rank sends more than half of its elements to one rank
    (drawn), small random shares (some zero) to the others.

    Raises:
        ConfigError: an unknown ``splits``.
    """
    n = world_size
    if splits == "even":
        return np.full((n, n), count // n, np.int64)
    if splits not in SPLITS:
        raise ConfigError(f"unknown splits {splits!r}; choose one of: {', '.join(SPLITS)}")
    rng = np.random.default_rng([seed, count, n, SPLITS.index(splits)])
    if splits == "random":
        weights = rng.random((n, n))
        weights[rng.random((n, n)) < _ZERO_SHARE] = 0.0
        m = np.zeros((n, n), np.int64)
        for r in range(n):
            if not weights[r].any():   # every share drawn zero: all of it to one rank
                weights[r, int(rng.integers(0, n))] = 1.0
            row = np.floor(weights[r] / weights[r].sum() * count).astype(np.int64)
            # What flooring left over goes to the first ranks with a share.
            takers = np.flatnonzero(weights[r])
            for index in range(int(count - row.sum())):
                row[takers[index % len(takers)]] += 1
            m[r] = row
        return m
    hot = int(rng.integers(0, n))
    # Each other share at most count / 2n: together under half, so the hot rank gets most.
    m = rng.integers(0, count // (2 * n) + 1, (n, n)).astype(np.int64)
    m[rng.random((n, n)) < _ZERO_SHARE] = 0
    m[:, hot] = 0
    m[:, hot] = count - m.sum(axis=1)
    return m


def busiest_link_bytes(m: np.ndarray, element_size: int) -> int:
    """The most bytes any one rank sends to other ranks or receives from them, with
    ``m[r, q]`` elements from rank r to rank q: with uneven splits the all-to-all's time is
    bound by that rank's link."""
    remote = np.array(m, np.int64)
    np.fill_diagonal(remote, 0)
    if not remote.size:
        return 0
    return int(max(remote.sum(axis=1).max(), remote.sum(axis=0).max())) * element_size


class AllToAll(Pattern):
    """``size`` is the bytes of each rank's input, all of it sent (``n`` blocks of one
    length with ``even`` splits; the split matrix's row with the others); busbw =
    algbw(n-1)/n, the all-gather's factor (nccl-tests' alltoall).

    Window layout per rank: [array][pad to 4 KiB][output][pad][splits]. Out of place
    the input is the array's first ``size`` bytes; in place the array is input and
    output at once, as long as the longer of the two on any rank. Splits depend on the
    size only (a bound call keeps its splits), data on (iteration, rank).

    All-to-all-v on GPUs passes its splits as int64 device arrays in the window's
    ``splits`` area (``input_splits`` then ``output_splits``, ``n`` counts each): the
    kernel reads the input splits at run time and fills the output splits, which
    ``check`` holds against what the senders send. On host memory they are host counts.
    """

    name = "alltoall"
    modes = ("out-of-place", "in-place")
    # The first call of a shape agrees on it over MPI: never inside a capture.
    warm_before_capture = True

    def __init__(self, algo: str = "auto", *, splits: str = "even",
                 datatype: str = "float32") -> None:
        """Raises:
            ConfigError: an unknown ``splits`` or ``datatype``.
        """
        if splits not in SPLITS:
            raise ConfigError(f"unknown splits {splits!r}; choose one of: {', '.join(SPLITS)}")
        if datatype not in DATATYPES:
            raise ConfigError(f"unknown datatype {datatype!r}; choose one of: "
                              f"{', '.join(DATATYPES)}")
        self.algo = algo
        self.splits = splits
        self.datatype = datatype
        # The library's spelling of the element type (``float`` is float32 here, float64
        # to numpy).
        self._dtype = ("bfloat16" if datatype == "bfloat16"
                       else np.dtype(DATATYPES[datatype][0]).name)
        self.collective = "all_to_all" if splits == "even" else "all_to_all_v"
        self._communicator: Any = None
        self._matrices: dict[tuple[int, int], np.ndarray] = {}
        # Thread blocks of the bound calls by size (GPU memory; the rows report them).
        self._blocks: dict[int, int] = {}
        # -R 1: the driver's window is registered with each communicator made (held until
        # that communicator closes), so peers read the inputs and the push all-to-all
        # stores into the outputs where they lie.
        self.register = False
        self._registered_with: Any = None

    @property
    def inter_engine_name(self) -> str | None:
        """The engine between nodes of the communicator spanning them (None on one node)."""
        return getattr(self._communicator, "inter", None)

    # -- sizes -------------------------------------------------------------------------
    def plan(self, size: int, world_size: int, element_size: int) -> SizePlan:
        per_rank = max(1, size // (world_size * element_size))
        total = per_rank * world_size * element_size
        return SizePlan(size=total, count=per_rank * world_size, block_bytes=total,
                        element_size=element_size)

    def split_matrix(self, plan: SizePlan, world_size: int) -> np.ndarray:
        """``m[r, q]``: the elements rank r sends rank q at ``plan`` (read-only)."""
        key = (plan.count, world_size)
        if key not in self._matrices:
            m = split_matrix(self.splits, plan.count, world_size)
            m.setflags(write=False)
            self._matrices[key] = m
        return self._matrices[key]

    def received_bytes(self, plan: SizePlan, rank: int, world_size: int) -> int:
        """Bytes rank ``rank`` receives at ``plan``."""
        return int(self.split_matrix(plan, world_size)[:, rank].sum()) * plan.element_size

    def array_bytes(self, plan: SizePlan, world_size: int) -> int:
        """Bytes of the in-place array (input and output), the same on every rank: the
        longest input or output of any rank."""
        received = self.split_matrix(plan, world_size).sum(axis=0)
        return max(plan.size, int(received.max()) * plan.element_size)

    def window_bytes(self, plan: SizePlan, world_size: int) -> int:
        return self._splits_offset(plan, world_size) + 2 * world_size * _SPLIT_BYTES

    def _splits_offset(self, plan: SizePlan, world_size: int) -> int:
        received = self.split_matrix(plan, world_size).sum(axis=0)
        return align(align(self.array_bytes(plan, world_size))
                     + int(received.max()) * plan.element_size)

    def _device_splits(self, window: Window, plan: SizePlan) -> tuple[Any, Any] | None:
        """(input splits, output splits) as this rank's int64 device arrays in the
        window, or None where the splits are host counts (even splits, host memory)."""
        if self.collective != "all_to_all_v" or not window.engine.has_streams:
            return None
        n = window.world_size
        start = self._splits_offset(plan, n)
        return (window.local.slice(start, n * _SPLIT_BYTES),
                window.local.slice(start + n * _SPLIT_BYTES, n * _SPLIT_BYTES))

    # -- the Pattern interface ---------------------------------------------------------
    def _input(self, window: Window, plan: SizePlan, mode: str) -> Any:
        if mode == "in-place":
            return window.local.slice(0, self.array_bytes(plan, window.world_size))
        return window.local.slice(0, plan.size)

    def _output(self, window: Window, plan: SizePlan, mode: str) -> Any:
        if mode == "in-place":
            return self._input(window, plan, mode)
        return window.local.slice(align(self.array_bytes(plan, window.world_size)),
                                  self.received_bytes(plan, window.rank, window.world_size))

    def prepare(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> None:
        engine = window.engine
        output = self._output(window, plan, mode)
        engine.upload(output, poison(output.nbytes))
        engine.upload(window.local.slice(0, plan.size),
                      self.input_bytes(plan, window.rank, window.world_size, iteration))
        splits = self._device_splits(window, plan)
        if splits is not None:
            sent, received = splits
            m = self.split_matrix(plan, window.world_size)
            engine.upload(sent, m[window.rank].astype("<i8").view(np.uint8))
            # -1 everywhere: a count the kernel failed to fill shows as wrong.
            engine.upload(received, np.full(received.nbytes, 0xFF, np.uint8))

    def fit_memory(self, device_memory: bool) -> None:
        # On GPUs all-to-all-v refuses to run in place (its segments move: the kernel
        # would overwrite input a peer has not read yet), so it is timed out of place.
        if device_memory and self.collective == "all_to_all_v":
            self.modes = ("out-of-place",)

    def bind(self, window: Window, plan: SizePlan, mode: str) -> Callable[[], None]:
        n, me = window.world_size, window.rank
        heap = 0
        if window.world.node_count > 1:
            # Across nodes every bound call keeps two scratch arrays as long as its input
            # in the node's heap (hierarchy.bind_all_to_all), and the driver holds a bound
            # call per region of the window and mode at once: the regions' inputs add up
            # to the window at most.
            base = getattr(window, "window", None) or window
            heap = 2 * len(self.modes) * base.nbytes + _SCRATCH_SLACK
        if self.register:
            refuse_registered_across_nodes(window)
        communicator = self._communicator = communicator_for(
            self._communicator, window, self.array_bytes(plan, n), heap,
            getattr(self, "inter", "auto"))
        if self.register and self._registered_with is not communicator:
            register_window(communicator, window, "uint8")
            self._registered_with = communicator
        inputs = typed_view(self._input(window, plan, mode), communicator.memory, self._dtype)
        output = (inputs if mode == "in-place" else
                  typed_view(self._output(window, plan, mode), communicator.memory,
                             self._dtype))
        algo = self.algo
        if self.collective == "all_to_all":
            bound = communicator.bind("all_to_all", output, inputs, algo=algo)
        elif (splits := self._device_splits(window, plan)) is not None:
            # Read (input) and filled (output) by the kernel at run time.
            sent, received = (typed_view(buffer, communicator.memory, "int64")
                              for buffer in splits)
            bound = communicator.bind("all_to_all_v", output, inputs, received, sent,
                                      algo=algo)
        else:
            m = self.split_matrix(plan, n)
            # Bound with its splits: every call of this size sends the same counts.
            bound = communicator.bind("all_to_all_v", output, inputs, m[:, me].tolist(),
                                      m[me].tolist(), algo=algo)
        blocks = getattr(bound, "blocks", None)
        if blocks:
            self._blocks[plan.size] = blocks
        return bound

    def check(self, window: Window, plan: SizePlan, mode: str, iteration: int) -> int:
        n, me = window.world_size, window.rank
        if self._communicator is not None and self._communicator.memory != "host":
            # A kernel that refused the splits (every rank finds the same first problem
            # and moves nothing: the eager all-to-all-v's slot at 3+ ranks), gave up on a
            # peer, or ranks that disagreed: raise with the cause here. Untouched outputs
            # would otherwise be counted as wrong elements.
            self._communicator.synchronize(window.engine.stream)
        got = window.engine.download(self._output(window, plan, mode))
        received = self.received_bytes(plan, me, n)
        wrong = count_wrong(got[:received], self.expected_bytes(plan, me, n, iteration),
                            plan.element_size)
        splits = self._device_splits(window, plan)
        if splits is not None:
            # The output splits the kernel filled: one wrong element per wrong count.
            filled = window.engine.download(splits[1]).view("<i8")
            wrong += int((filled != self.split_matrix(plan, n)[:, me]).sum())
        return wrong

    def bandwidth(self, plan: SizePlan, seconds: float, world_size: int) -> tuple[float, float]:
        algbw = plan.size / seconds / 1e9
        return algbw, algbw * allgather_busbw_factor(world_size)

    def link_gbps(self, plan: SizePlan, seconds: float, world_size: int) -> tuple[float, str]:
        """The busiest link's bytes over the time: busbw's (n-1)/n of the input with even
        splits, and with uneven ones what the most loaded rank really sends or receives,
        which busbw under- or overstates (a skew that sends 86 % of an input to one peer
        asks 1.7x busbw of that link)."""
        link = busiest_link_bytes(self.split_matrix(plan, world_size), plan.element_size)
        return link / seconds / 1e9, "the busiest link's rate"

    def row_facts(self, plan: SizePlan, world_size: int, row: Any) -> dict[str, Any]:
        """The busiest link's bytes; on GPUs also the time they take at LINK_BOUND_GBPS
        (``bound_us``), the fraction of that bound the first mode reached
        (``bound_fraction``: bound_us / time_us, 1 at the link's speed) and the thread
        blocks (SMs) of the call (``blocks``)."""
        link = busiest_link_bytes(self.split_matrix(plan, world_size), plan.element_size)
        facts: dict[str, Any] = {"busiest_link_bytes": link}
        blocks = self._blocks.get(plan.size)
        if blocks is None:   # host memory: no link of a GPU to hold it to
            return facts
        bound_us = link / (LINK_BOUND_GBPS * 1e3)
        # Four significant digits, not decimals: a few KiB take 0.02 us at the link's
        # speed, and such a call's fraction on a GPU shared under MPS (hundreds of us)
        # rounded to 4 decimals read 0.0.
        facts["bound_us"] = float(f"{bound_us:.4g}")
        measured = row.primary
        if measured.usable:
            facts["bound_fraction"] = float(f"{bound_us / measured.time_us:.4g}")
        facts["blocks"] = blocks
        return facts

    def fact_lines(self, facts: dict[str, Any]) -> list[str]:
        if "blocks" not in facts:
            return []
        fraction = facts.get("bound_fraction")
        reached = "" if fraction is None else f", {fraction:.2f} of it reached"
        return [f"#  busiest link {facts['busiest_link_bytes']} B: bound "
                f"{facts['bound_us']:.2f} us at {LINK_BOUND_GBPS:g} GB/s{reached}; "
                f"{facts['blocks']} blocks"]

    # -- data, for this case and its baseline -------------------------------------------
    def input_bytes(self, plan: SizePlan, rank: int, world_size: int, iteration: int,
                    ) -> np.ndarray:
        """Rank ``rank``'s seeded input of ``iteration`` (``plan.size`` bytes)."""
        return seeded_bytes(iteration, rank, plan.size)

    def expected_bytes(self, plan: SizePlan, rank: int, world_size: int, iteration: int,
                       ) -> np.ndarray:
        """What rank ``rank`` receives in ``iteration``, packed in rank order: from each
        rank r, the elements r sends it, which follow those r sends to lower ranks."""
        m = self.split_matrix(plan, world_size)
        item = plan.element_size
        parts = []
        for sender in range(world_size):
            start = int(m[sender, :rank].sum()) * item
            nbytes = int(m[sender, rank]) * item
            if nbytes:
                data = self.input_bytes(plan, sender, world_size, iteration)
                parts.append(data[start:start + nbytes])
        return np.concatenate(parts) if parts else np.empty(0, np.uint8)
