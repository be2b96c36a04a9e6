"""The barriers of a window: host and node barriers through the signal pads (or MPI where
host stores are not ordered), stream-ordered ones on any stream, the device barrier
kernel, and the graph-safe flag barriers of ranks sharing a GPU that takes turns."""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import Any, Protocol

from ..backends import Backend, Buffer
from ..liveness.deadline_waits import watched_barrier
from ..liveness.pidfd_watch import PeerWatch
from ..runtime.errors import WindowError
from ..runtime.settings import shared_gpu_barrier
from ..topology.peer_paths import PathPlan
from ..topology.world import World
from .layout import (
    DEVICE_BARRIER_EPOCH_SLOT,
    DEVICE_BARRIER_SLOT_BASE,
    FLAG_BARRIER_RANKS,
    FLAG_BARRIER_SLOT_BASE,
)

__all__ = ["WindowBarriers", "BarrierParts"]

# Flag-based barriers need stores that become visible in program order.
_ORDERED_HOST_STORES = platform.machine().lower() in ("x86_64", "amd64")


class BarrierParts(Protocol):
    """What barriers need of a window (Window fills it in)."""

    world: World
    backend: Backend
    engine: Any
    paths: PathPlan
    staged: Any  # the staged copies, None where every peer of the node is mapped
    time_sliced_gpus: dict[str, list[int]]  # GPUs whose contexts take turns
    signal_timeout: float


class WindowBarriers:
    """Every barrier of one window, made on first use and kept: their epochs count every
    use, whichever caller. ``pads`` are the window's signal pads mapped here (by rank);
    the window's staged copies (if any) carry the barrier, through their inbox words, to
    the peers this rank cannot map. ``watch`` names a dead peer in host waits."""

    def __init__(self, window: BarrierParts, *, pads: dict[int, Buffer],
                 watch: PeerWatch | None) -> None:
        self.window = window
        self.pads = pads
        self.watch = watch
        self._barrier: Callable[[], None] | None = None
        # Stream-ordered barriers on the same pad words share one epoch, whatever stream
        # they run on; keyed by stream handle (None: the engine's own stream).
        self._barrier_epochs = [0]
        self._host_barrier_epochs = [0]
        self._stream_barriers: dict[Any, Callable[[], None]] = {}
        self._device_barriers: dict[Any, Callable[[], None]] = {}
        self._flag_barrier_turn = [0]
        self._node_barrier: Callable[[], None] | None = None

    def barrier(self, engine: Any) -> None:
        """The window's barrier, enqueued on ``engine``'s stream."""
        if engine is not self.window.engine:
            key = int(engine.stream)
            if key not in self._stream_barriers:
                self._stream_barriers[key] = self._make_barrier(engine)
            self._stream_barriers[key]()
            return
        if self._barrier is None:
            self._barrier = self._make_barrier(self.window.engine)
        self._barrier()

    def node_barrier(self) -> None:
        """The barrier over this node's ranks, on the window's own stream."""
        if self._node_barrier is None:
            self._node_barrier = self._make_node_barrier(self.window.engine)
        self._node_barrier()

    def device_barrier(self, engine: Any) -> None:
        """The device barrier kernel, launched on ``engine``'s stream (compiled and
        loaded on first use).

        Raises:
            WindowError: a backend without kernels, or more than 8 ranks on the node.
        """
        if not self.window.backend.has_kernels:
            raise WindowError(f"device_barrier runs a kernel: a {self.window.backend.name} "
                              "window has none (use barrier())")
        key = int(engine.stream)
        if key not in self._device_barriers:
            self._device_barriers[key] = self._make_device_barrier(engine)
        self._device_barriers[key]()

    def load_device_barrier(self, engine: Any) -> None:
        """Compile and load the device barrier for ``engine``'s stream now: module
        loading has no place in a CUDA graph capture.

        Raises:
            WindowError: a backend without kernels, or more than 8 ranks on the node.
        """
        if not self.window.backend.has_kernels:
            raise WindowError("a graph-safe view runs device_barrier, a kernel: a "
                              f"{self.window.backend.name} window has none")
        key = int(engine.stream)
        if key not in self._device_barriers:
            self._device_barriers[key] = self._make_device_barrier(engine)

    def clear(self) -> None:
        """Forget every barrier (the window closes)."""
        self._barrier = None
        self._stream_barriers.clear()
        self._device_barriers.clear()
        self._node_barrier = None
        self.pads = {}

    def _refuse_graph_flag_barrier(self) -> None:
        """Raise WindowError where the graph flag sets cannot serve the node: more ranks
        than a set has words, or a pair without peer access."""
        world = self.window.world
        if world.local_size > FLAG_BARRIER_RANKS:
            raise WindowError(f"graph-safe barriers of ranks sharing a GPU span at most "
                              f"{FLAG_BARRIER_RANKS} ranks of a node; this node has "
                              f"{world.local_size}")
        self.refuse_without_direct_peers("a graph-safe barrier")

    def graph_flag_barrier(self, engine: Any) -> Callable[[], None]:
        """The graph-safe barrier where ranks share a GPU that takes turns between their
        contexts (``time_sliced_gpus``; under MPS the device barrier serves): fixed-value
        stream memory operations in two alternating sets of pad words (a replay repeats
        the same operations). The device barrier kernel would spin on a peer's flag while holding a
        time-shared GPU that the peer needs: 4.5 ms per all-gather on 2 H200s shared by 3
        ranks (docs/GPU.md, "Several ranks on one GPU").

        Raises:
            WindowError: more than FLAG_BARRIER_RANKS ranks on the node.
        """
        world = self.window.world
        self._refuse_graph_flag_barrier()
        others = self.window.paths.direct_peers(world.rank)

        def what(slot: int) -> str:
            rank = world.local_ranks[slot % FLAG_BARRIER_RANKS]
            return f"{world.where()} in a graph barrier waiting for {world.where(rank)}"
        barriers = []
        for turn in range(2):
            base = FLAG_BARRIER_SLOT_BASE + turn * FLAG_BARRIER_RANKS
            barriers.append(engine.make_flag_barrier(
                self.pads[world.rank], [self.pads[r] for r in others],
                base + world.local_rank, [base + world.local_index(r) for r in others],
                timeout=self.window.signal_timeout, what=what))
        turn = self._flag_barrier_turn  # one alternation for every view of the window

        def barrier() -> None:
            barriers[turn[0]]()
            turn[0] ^= 1
        return barrier

    def graph_party_barrier(self, engine: Any, parties: list[int]) -> Callable[[], None]:
        """``graph_flag_barrier`` met by one stream for several ranks of the node
        (``parties``, world ranks): the lowest rank of a GPU that takes turns stores the
        flags of every rank on it and waits for those of all other ranks, so the others
        on that GPU put no barrier on theirs (each such switch of contexts costs the GPU
        several microseconds). A rank whose barrier another rank meets calls this with no
        parties: it enqueues nothing and keeps the window's alternation of flag sets, so
        graph_flag_barrier and this one mix on the window. Every rank of the node must
        call it, with the parties of its GPU's lowest rank or none.

        Raises:
            WindowError: more than FLAG_BARRIER_RANKS ranks on the node, or a pair of the
                node without peer access.
        """
        world = self.window.world
        self._refuse_graph_flag_barrier()
        others = [r for r in world.local_ranks if r not in parties]

        def what_for(party: int) -> Callable[[int], str]:
            for_whom = "" if party == world.rank else f" for rank {party}"
            return lambda slot: (f"{world.where()} in a graph barrier{for_whom} waiting for "
                                 f"{world.where(world.local_ranks[slot % FLAG_BARRIER_RANKS])}")
        barriers: list[Callable[[], None] | None] = []
        for turn in range(2):
            base = FLAG_BARRIER_SLOT_BASE + turn * FLAG_BARRIER_RANKS
            barriers.append(engine.make_party_flag_barrier(
                [(self.pads[party], [self.pads[r] for r in others],
                  base + world.local_index(party), [base + world.local_index(r) for r in others],
                  what_for(party)) for party in parties],
                timeout=self.window.signal_timeout) if parties and others else None)
        turn = self._flag_barrier_turn

        def barrier() -> None:
            met = barriers[turn[0]]
            if met is not None:
                met()
            turn[0] ^= 1
        return barrier

    def _make_device_barrier(self, engine: Any) -> Callable[[], None]:
        from ..kernels.launcher import MAX_KERNEL_RANKS, BarrierArgs

        world = self.window.world
        self.refuse_without_direct_peers("device_barrier")
        if world.local_size > MAX_KERNEL_RANKS:
            raise WindowError(f"device_barrier spans at most {MAX_KERNEL_RANKS} ranks of a "
                              f"node; this node has {world.local_size}")
        args = BarrierArgs()
        for index, rank in enumerate(world.local_ranks):
            args.pads[index] = self.pads[rank].ptr
        args.timeout_ns = int(self.window.signal_timeout * 0.5e9)
        args.rank, args.nranks = world.local_rank, world.local_size
        args.slot_base, args.epoch_word = DEVICE_BARRIER_SLOT_BASE, DEVICE_BARRIER_EPOCH_SLOT
        return self.window.backend.kernels("barrier.cu").launcher(
            "device_barrier", args, grid=1, block=32, stream=engine.stream)

    def _make_node_barrier(self, engine: Any) -> Callable[[], None]:
        world = self.window.world
        if not _ORDERED_HOST_STORES and not self.window.backend.device_memory:
            return world.local_comm.Barrier
        if self.window.time_sliced_gpus and shared_gpu_barrier() == "host":
            return self._make_host_synchronised_barrier(engine)
        others = self.window.paths.direct_peers(world.rank)

        def what(slot: int) -> str:
            return f"{world.where()} in barrier waiting for {world.where(world.local_ranks[slot])}"
        # Device engines may run barriers on several streams: one epoch for all of them.
        shared = {"epochs": self._barrier_epochs} if engine.has_streams else {}
        through_pads = engine.make_barrier(
            self.pads[world.rank], [self.pads[r] for r in others], world.local_rank,
            [world.local_index(r) for r in others], timeout=self.window.signal_timeout,
            what=what, **shared)
        if self.window.staged is None:
            return through_pads
        # Peers whose pads we cannot map meet us in the pinned inboxes instead: the same
        # one word per local rank, in host memory both GPUs reach. Pad words first, then
        # inbox words, on every rank alike, so neither half waits on the other.
        inboxes = self.window.staged
        through_inboxes = engine.make_barrier(
            inboxes.own_words, [inboxes.words_of(r) for r in inboxes.peers], world.local_rank,
            [world.local_index(r) for r in inboxes.peers], timeout=self.window.signal_timeout,
            what=what, epochs=self._host_barrier_epochs)

        def barrier() -> None:
            through_pads()
            through_inboxes()
        return barrier

    def _make_host_synchronised_barrier(self, engine: Any) -> Callable[[], None]:
        """The node barrier when ranks share a GPU that takes turns: wait for our stream,
        then meet on the host. Without MPS the contexts of one GPU take turns in time
        slices, and a stream that waits on a peer's flag holds its turn while the peer, on
        the same GPU, cannot run to write it (docs/GPU.md, "Several ranks on one GPU").
        The host blocks."""
        world, watch, timeout = self.window.world, self.watch, self.window.signal_timeout

        def barrier() -> None:
            engine.synchronize()  # our writes into peers' windows have landed
            watched_barrier(world.local_comm, watch=watch, timeout=timeout,
                            what=f"{world.where()} in a barrier (ranks share a GPU)")
        return barrier

    def refuse_without_direct_peers(self, what: str) -> None:
        """Raise WindowError when some pair of the node is not direct (naming it): ``what``
        needs every peer's memory mapped. The plan is the node's, so every rank of the
        node refuses alike."""
        plan = self.window.paths
        if not plan.has_fallbacks:
            return
        pair = min(tuple(sorted(p)) for p in plan.indirect)
        a, b = pair
        raise WindowError(
            f"{what} needs every peer's window mapped, but rank {a} ({plan.label(a)}) and "
            f"rank {b} ({plan.label(b)}) have no peer access ({plan.path(a, b).reason}; "
            f"their path is {plan.kind(a, b)}): use barrier() and the copy engine instead")

    def _make_barrier(self, engine: Any) -> Callable[[], None]:
        world = self.window.world
        if not _ORDERED_HOST_STORES and not self.window.backend.device_memory:
            return world.comm.Barrier
        if engine is not self.window.engine:
            node_barrier = self._make_node_barrier(engine)
        else:
            if self._node_barrier is None:
                # One node barrier per window: its epochs count every use, whichever caller.
                self._node_barrier = self._make_node_barrier(engine)
            node_barrier = self._node_barrier
        if world.node_count == 1:
            return node_barrier
        comm = world.comm

        def barrier() -> None:
            node_barrier()
            engine.synchronize()
            comm.Barrier()
        return barrier
