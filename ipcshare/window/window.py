"""``Window``: one symmetric buffer per rank plus a signal pad, mapped in every process
of the node; its setup is one transaction (allocate, export, exchange, import, map)
that undoes itself on a failure half-way."""

from __future__ import annotations

import contextlib
import operator
import time
from collections.abc import Callable
from typing import Any

from ..backends import Allocation, Backend, Buffer
from ..exchange import Exchange, OwnedFd
from ..liveness.consensus import Rendezvous
from ..runtime.config import format_size, human_bytes, is_seconds
from ..runtime.errors import SignalTimeout, WindowError, WindowTooLarge
from ..topology.peer_paths import PathPlan
from ..topology.world import World, describe_disagreement
from .barriers import WindowBarriers
from .layout import (
    BARRIER_SLOTS,
    ERROR_SLOT,
    PAD_WORDS,
    SIGNAL_PAD_BYTES,
    USER_SLOT_BASE,
    WindowLayout,
)
from .views import StreamWindow, typed_view

__all__ = ["Window"]


def _spell_nbytes(nbytes: Any) -> str:
    """``nbytes=2097152 (2M)``: the argument as given, then its size where that reads
    shorter."""
    text = f"nbytes={nbytes!r}"
    if isinstance(nbytes, int) and not isinstance(nbytes, bool) and nbytes > 0:
        short = format_size(nbytes)
        if short != str(nbytes):
            text += f" ({short})"
    return text




class Window:
    """One symmetric buffer per rank and a signal pad after it, mapped on every rank of
    the node. Created by ``Group.window`` from what the group settled (its world,
    backend, exchange, rendezvous and peer paths); ``close()`` is idempotent and
    collective."""

    def __init__(self, nbytes: int, *, world: World, backend: Backend, exchange: Exchange,
                 rendezvous: Rendezvous, paths: PathPlan, fallbacks_anywhere: bool,
                 shared_gpus: dict[str, list[int]],
                 time_sliced_gpus: dict[str, list[int]], signal_timeout: float,
                 on_close: Callable[[Window], None] | None = None,
                 group: Any = None) -> None:
        # The group this window belongs to, for callers that want the rest of it (its
        # communicator, say); the window itself needs only what it was given.
        self.group = group
        self.world = world
        self.backend = backend
        self.engine = backend.engine()
        # How each pair of the node reaches the other: pairs without peer access copy
        # through relays and host memory (staged_copy).
        self.paths = paths
        # GPU UUID -> the node's world ranks on it, for GPUs that several ranks use, and
        # those of them whose contexts take turns in time slices (not all MPS clients).
        # Only the latter need barriers met on the host and patterns that keep one
        # context's work on a GPU at a time; under MPS the contexts run side by side
        # and the usual kernels serve (docs/GPU.md, "Several ranks on one GPU").
        self.shared_gpus = shared_gpus
        self.time_sliced_gpus = time_sliced_gpus
        self.signal_timeout = signal_timeout
        # Whether some node of the job has a pair without peer access (then every rank
        # joins the pinned-inbox exchange of each window: a job-wide collective).
        self.fallbacks_anywhere = fallbacks_anywhere
        self._rendezvous = rendezvous
        self._on_close = on_close
        self._closed = False
        self.staged: Any = None
        self._allocations: dict[int, Allocation] = {}
        # Milliseconds this rank spent in each setup step (the table header shows them).
        self.setup_ms: dict[str, float] = {}
        lap = _Lap(self.setup_ms)
        if not isinstance(nbytes, (bool, int)) and hasattr(nbytes, "__index__"):
            nbytes = operator.index(nbytes)   # a numpy integer is a size too
        sizes = rendezvous.collective("window rendezvous", nbytes)
        with rendezvous.step("window rendezvous"):
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                raise WindowError(f"window size must be a non-negative int, got {nbytes!r}")
            if any(size != sizes[0] for size in sizes):
                raise WindowError("ranks disagree on the window size: " + describe_disagreement(
                    sizes, verb=("passes", "pass"), spell=_spell_nbytes))
            if world.local_size > BARRIER_SLOTS:
                raise WindowError(f"{world.local_size} ranks on one node; at most {BARRIER_SLOTS}")
        self.nbytes = nbytes
        self.layout = layout = WindowLayout.plan(nbytes, backend.granularity, paths)
        self.pad_offset = layout.pad_offset
        self.relay_offset = layout.relay_offset
        self.total_bytes = layout.total_bytes
        with contextlib.ExitStack() as undo:
            lap("rendezvous")
            with rendezvous.step("allocate"):
                capacity = backend.capacity_bytes()
                needed = self.total_bytes * world.host_size
                if capacity is not None and needed > capacity:
                    ranks = (f" on each of the node's {world.host_size} ranks needs "
                             f"{human_bytes(needed)} in all" if world.host_size > 1
                             else f" needs {human_bytes(needed)}")
                    raise WindowTooLarge(
                        f"a window of {human_bytes(nbytes)}{ranks}, more than the "
                        f"{human_bytes(capacity)} available: choose a smaller size")
                local = backend.allocate(self.total_bytes)
                undo.callback(local.close)
                self._allocations[world.rank] = local
            exported = None
            lap("allocate")
            with rendezvous.step("export"):
                exported = backend.export(local)
                undo.callback(exported.close)
                # Zero the pad before any peer can see it, so stale flags never leak in.
                self.engine.upload(local.buffer(self.pad_offset, SIGNAL_PAD_BYTES),
                                   _zeros(SIGNAL_PAD_BYTES))
                self.engine.synchronize()
            lap("export")
            with rendezvous.step("handle exchange"):
                payloads = exchange.share_bytes(exported.payload, kind=backend.name)
            fds: dict[int, OwnedFd] = {}
            if backend.uses_fds and world.size > 1:  # every rank joins: it agrees world-wide
                fds = exchange.share_fds(exported.fd)  # collective, agrees itself
                for owned in fds.values():
                    undo.callback(owned.close)
            lap("exchange")
            with rendezvous.step("import"):
                # Only the peers this rank's GPU reaches; the others go through staging.
                peers = self.paths.direct_peers(world.rank)
                mappings = backend.import_peers([(payloads[r], fds.get(r)) for r in peers],
                                                self.total_bytes)
                for rank, mapping in zip(peers, mappings, strict=True):
                    undo.callback(mapping.close)
                    self._allocations[rank] = mapping
            # Imports hold what they need; the descriptors and the export can go now.
            for owned in fds.values():
                owned.close()
            exported.close()
            lap("import")
            if fallbacks_anywhere:  # every rank joins: the inbox exchange is job-wide
                from .staged_copy import open_staged_copy

                self.staged = open_staged_copy(
                    undo, rendezvous=rendezvous, exchange=exchange, world=world,
                    plan=paths, engine=self.engine, device=backend.device,
                    relay_areas=self._relay_areas, slot_bytes=layout.slot_bytes,
                    timeout=signal_timeout)
                lap("fallback setup")
            undo.pop_all()
        self._buffers = {r: a.buffer(0, nbytes) for r, a in self._allocations.items()}
        # One object for this rank's bytes: DESIGN promises ``w.peer(g.rank) is w.local``.
        self._local_buffer = self._buffers[world.rank]
        self._pads = {r: a.buffer(self.pad_offset, SIGNAL_PAD_BYTES)
                      for r, a in self._allocations.items()}
        self._barriers = WindowBarriers(self, pads=self._pads, watch=rendezvous.watch)

    def _relay_areas(self, relays: set[int]) -> dict[int, Buffer]:
        """The relay staging of each rank of ``relays`` (mapped here)."""
        return {rank: self._allocations[rank].buffer(self.relay_offset, self.layout.relay_bytes)
                for rank in relays}

    # -- the public API --------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def world_size(self) -> int:
        return self.world.size

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def local(self) -> Buffer:
        """This rank's buffer."""
        self._check_open()
        return self._local_buffer

    def peer(self, rank: int) -> Buffer:
        """Rank ``rank``'s buffer, mapped here (``peer(self.rank)`` is ``local``).

        Raises:
            WindowError: closed window, rank out of range, a rank on another node, or a
                rank whose GPU this rank's GPU has no peer access to (see ``path``).
        """
        self._check_open()
        self._check_rank(rank)
        return self._buffers[rank]

    def get_buffer(self, rank: int, shape: int | tuple[int, ...], dtype: Any,
                   offset: int = 0) -> Any:
        """Rank ``rank``'s buffer (mapped here) from byte ``offset`` as a C-contiguous
        array of ``shape`` and ``dtype``, without a copy, like PyTorch symmetric memory's
        ``get_buffer``: a numpy array on host memory, a ``DeviceArray`` on a GPU
        (``torch.from_dlpack`` / ``cupy.from_dlpack`` view it). ``dtype``: a name
        (``"bfloat16"``), a numpy dtype or a torch dtype. Not collective.

        Raises:
            WindowError: as ``peer``; a bad shape, dtype or offset (not a multiple of
                the item size), or a view that runs past the window's ``nbytes``.
        """
        return typed_view(self.peer(rank), shape, dtype, offset,
                          device_memory=self.backend.device_memory)

    def path(self, rank: int) -> str:
        """How this rank reaches rank ``rank``: ``self``, ``direct`` (mapped), ``relay``
        (through a third GPU's window), ``host-staged`` (through pinned host memory),
        or ``mpi`` (another node). The same answer on both ends of a pair.

        Raises:
            WindowError: rank out of range.
        """
        self._check_in_group(rank)
        if not self.world.is_local(rank):
            return "mpi"
        return self.paths.kind(self.world.rank, rank)

    def is_local(self, rank: int) -> bool:
        """Whether rank ``rank``'s buffer is mapped here (same node); the others are
        reached through MPI.

        Raises:
            WindowError: rank out of range.
        """
        self._check_in_group(rank)
        return self.world.is_local(rank)

    @property
    def buffer_ptrs(self) -> list[int]:
        """One address per rank (0 for ranks on other nodes)."""
        self._check_open()
        return [self._buffers[r].ptr if r in self._buffers else 0 for r in range(self.world.size)]

    @property
    def signal_pad_ptrs(self) -> list[int]:
        """Address of each rank's signal pad (0 for ranks on other nodes)."""
        self._check_open()
        return [self._pads[r].ptr if r in self._pads else 0 for r in range(self.world.size)]

    def signal_pad(self, rank: int) -> Buffer:
        """Rank ``rank``'s signal pad: SIGNAL_PAD_BYTES of 64-bit words.

        Raises:
            WindowError: as ``peer``.
        """
        self._check_open()
        self._check_rank(rank)
        return self._pads[rank]

    def put_signal(self, rank: int, slot: int, value: int, *, stream: Any = None) -> None:
        """Write ``value`` (0 to 2**64 - 1) into word ``slot`` of rank ``rank``'s pad,
        after this rank's earlier writes (release). Users' slots are ``USER_SLOT_BASE``
        (256) to 510; the others are ipcshare's (barriers, kernels).

        On GPU windows the store is enqueued on ``stream`` (default: the window's own;
        see ``on_stream`` for what a stream may be).

        Raises:
            WindowError: a closed window, a rank outside the group, a slot that is not a
                user's, or a value that is not a whole number in range.
        """
        self._check_open()
        slot = _user_slot(slot)
        value = _whole(value, "value")
        if not 0 <= value < 1 << 64:
            raise WindowError(f"value={value}: a signal word holds 0 to 2**64 - 1")
        self._engine_on(stream).store_signal(self.signal_pad(_whole(rank, "rank")), slot,
                                             value)

    def wait_signal(self, slot: int, value: int, *, peer: int | None = None,
                    timeout: float | None = None, stream: Any = None) -> None:
        """Wait until word ``slot`` of this rank's pad is >= ``value`` (acquire).

        On GPU windows the wait is enqueued on ``stream`` (default: the window's own) and
        the host does not block; a synchronize after ``timeout`` raises instead of hanging.

        Raises:
            SignalTimeout: naming ``peer`` (the rank expected to signal) and the slot.
            WindowError: a closed window, a slot that is not a user's (as ``put_signal``),
                a ``peer`` outside the group, or a ``timeout`` that is not a positive
                number of seconds.
        """
        self._check_open()
        slot = _user_slot(slot)
        value = _whole(value, "value")
        if not 0 <= value < 1 << 64:
            raise WindowError(f"value={value}: a signal word holds 0 to 2**64 - 1")
        if peer is not None:
            peer = _whole(peer, "peer")
            self._check_in_group(peer)
        if timeout is not None and not is_seconds(timeout):
            raise WindowError(f"timeout={timeout!r}: give a positive number of seconds, or "
                              "None for the window's signal timeout")
        who = f"waiting for {self.world.where(peer)}" if peer is not None else "waiting"
        self._engine_on(stream).wait_signal(
            self._pads[self.world.rank], slot, value,
            timeout=self.signal_timeout if timeout is None else timeout,
            what=f"{self.world.where()} {who}")

    def barrier(self, stream: Any = None) -> None:
        """Collective over the node's ranks: returns once every rank has entered it, and
        each rank's earlier writes into windows are visible to all.

        Host windows use the signal pads (no MPI call) where host stores are ordered, an
        MPI barrier otherwise. GPU windows enqueue it on ``stream`` (default: the
        window's own) with stream memory operations; the host does not block. On
        multi-node groups the node barriers are joined by MPI.
        """
        self._check_open()
        self._barriers.barrier(self._engine_on(stream))

    def device_barrier(self, stream: Any = None) -> None:
        """Like ``barrier`` on a GPU window, but run by a one-block kernel that keeps its
        epoch on the device, so it can be captured in a CUDA graph and replayed. Over
        the node's ranks (at most 8). A peer that never arrives makes the kernel give up
        after half the signal timeout; ``synchronize()`` then raises naming it.

        Raises:
            WindowError: a host window, or more than 8 ranks on the node.
            KernelCompileError: NVRTC is missing or the kernel does not compile.
        """
        self._check_open()
        self._barriers.device_barrier(self._engine_on(stream))

    def graph_party_barrier(self, stream: Any, parties: list[int]) -> Callable[[], None]:
        """A graph-safe barrier on ``stream`` that this rank meets for every rank of
        ``parties`` (world ranks of its GPU, itself first; empty where another rank meets
        for it): for patterns on GPUs whose contexts take turns, where only one rank per
        GPU should put work on it (barriers.py, ``graph_party_barrier``). Every rank of
        the node makes the same number of calls of the barrier it gets.

        Raises:
            WindowError: a host window, more ranks than the flag sets hold, or a pair
                without peer access.
        """
        self._check_open()
        if not self.engine.has_streams:
            raise WindowError(f"a {self.backend.name} window has no CUDA streams for a "
                              "graph-safe barrier")
        return self._barriers.graph_party_barrier(self._engine_on(stream), parties)

    def on_stream(self, stream: Any, *, graph_safe: bool = False) -> StreamWindow:
        """This window with its GPU work enqueued on ``stream``: a cuda.core Stream (or
        anything with ``__cuda_stream__``), a ``torch.cuda.Stream``, a cupy stream, a
        ``CUstream`` or a raw handle. Patterns bound to the view run on that stream.
        With ``graph_safe``, the view's ``barrier`` is ``device_barrier``, so work bound
        to it can be captured in a CUDA graph.

        Raises:
            ConfigError: not a stream, or one of another device.
            WindowError: a host window (host memory has no streams).
        """
        self._check_open()
        if not self.engine.has_streams:  # also for stream=None, as the docstring says
            raise WindowError(f"a {self.backend.name} window has no CUDA streams to bind "
                              "a view to: call the window's own methods")
        engine = self._engine_on(stream)
        if graph_safe and self.time_sliced_gpus:
            barrier = self._barriers.graph_flag_barrier(engine)
        elif graph_safe:
            self._barriers.load_device_barrier(engine)

            def barrier() -> None:
                self.device_barrier(engine.stream)
        else:
            def barrier() -> None:
                self.barrier(engine.stream)
        return StreamWindow(self, engine, barrier, graph_safe=graph_safe)

    def synchronize(self) -> None:
        """Wait for the window's stream, then raise if one of ipcshare's kernels on this
        rank gave up waiting for a peer (it records why in the pad's error word).

        Raises:
            SignalTimeout: naming the silent peer.
        """
        self._check_open()
        self.engine.synchronize()
        self.raise_kernel_error()

    def raise_kernel_error(self, what: str = "a kernel") -> None:
        """Raise SignalTimeout if a kernel on this rank recorded a timeout in the error
        word of its pad (after the stream has finished)."""
        if not self.backend.has_kernels:
            return
        word = self.engine.download(self.signal_pad(self.rank).slice(ERROR_SLOT * 8, 8))
        code = int(word.view("<u8")[0])
        if code:
            peer = self.world.local_ranks[(code >> 48) - 1]
            raise SignalTimeout(
                f"{self.world.where()}: {what} gave up waiting for {self.world.where(peer)} "
                f"(epoch {code & 0xFFFFFFFFFFFF}) after {self.signal_timeout / 2:g} s")

    def _engine_on(self, stream: Any) -> Any:
        if stream is None:
            return self.engine
        if not self.engine.has_streams:
            raise WindowError(f"a {self.backend.name} window has no CUDA streams: "
                              "call without stream=")
        return self.engine.on_stream(stream)

    def node_barrier(self) -> None:
        """Collective over this node's ranks only (no MPI call where host stores are
        ordered): returns once each of them entered it, their earlier window writes
        visible. On a GPU the barrier is stream-ordered: the host does not wait."""
        self._check_open()
        self._barriers.node_barrier()

    def close(self) -> None:
        """Unmap peers and free this rank's memory. Idempotent; collective (it waits for
        the node's ranks so nobody's memory goes while a peer may still touch it)."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                self._drain_stream()
                if self.staged is not None:  # lanes another stream's work left running
                    self.staged.drain(self.signal_timeout)
            finally:
                # Even when our stream failed, the peers are waiting in this barrier.
                self._rendezvous.wait_for_node("closing a window")
        finally:
            staged, self.staged = self.staged, None
            try:
                if staged is not None:  # lanes and inboxes first: they use the mappings
                    staged.close()
            finally:
                self._buffers.clear()
                self._pads.clear()
                self._local_buffer = None
                self._barriers.clear()
                for rank in sorted(self._allocations, key=lambda r: r == self.world.rank):
                    self._allocations[rank].close()  # peers' mappings first, own memory last
                self._allocations.clear()
                if self._on_close is not None:
                    self._on_close(self)

    def _drain_stream(self) -> None:
        """Wait for this window's stream. When it is stuck on a wait for a peer's signal
        that never came (the SignalTimeout it raises is the caller's to see), first meet
        our unmet waits from the host, so the stream drains and the memory freed after this
        is not under a blocked stream (cuMemFree would wait for it forever). Our waits lie
        in our own pad, and, for the rank that runs the stepped calls of a time-sliced GPU,
        in the pads of the ranks sharing it (collectives/time_sliced.py). After a timeout
        that ``synchronize`` already raised, the waits are met at once: the error has been
        seen, and the peers wait for this rank in the closing barrier meanwhile."""
        engine = self.engine
        me = self.world.rank
        pads = [self._pads.get(me)] + [self._pads.get(rank)
                                       for ranks in self.time_sliced_gpus.values()
                                       if me in ranks for rank in ranks if rank != me]
        pads = [pad for pad in pads if pad is not None]
        if engine.has_streams and getattr(engine, "timed_out", False):
            for pad in pads:
                engine.release_waits(pad)
        try:
            engine.synchronize()
        except SignalTimeout:
            if engine.has_streams and sum(engine.release_waits(pad) for pad in pads):
                try:
                    engine.synchronize()
                except SignalTimeout:
                    pass  # something else holds the stream: the first error says enough
            raise

    def __enter__(self) -> Window:
        return self

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        self._rendezvous.close_on_exit(error, self.close, "closing a window")

    def _check_open(self) -> None:
        if self._closed:
            raise WindowError("window is closed")

    def _check_in_group(self, rank: int) -> None:
        try:
            number = None if isinstance(rank, bool) else operator.index(rank)
        except TypeError:
            number = None
        if number is None or not 0 <= number < self.world.size:
            raise WindowError(f"rank {rank!r} is not in this group of {self.world.size}")

    def _check_rank(self, rank: int) -> None:
        self._check_in_group(rank)
        world = self.world
        if not world.is_local(rank):
            kind = "virtual node" if world.virtual_nodes else "node"
            raise WindowError(
                f"rank {rank} is on {kind} {world.node_of_rank[rank]} "
                f"({world.hostnames[rank]}), {world.where()} on {kind} {world.node_index}: "
                f"its memory is not mapped here; reach it through MPI")
        if rank not in self._buffers and not self._closed:
            me, plan = world.rank, self.paths
            raise WindowError(
                f"{world.where()} ({plan.label(me)}) cannot map the window of "
                f"{world.where(rank)} ({plan.label(rank)}): {plan.path(me, rank).reason}; "
                f"their bytes go by {plan.describe(me, rank)} (path "
                f"{plan.kind(me, rank)!r}): move them with the window's staged copies, as "
                "the copy-engine all-gather and the ring do")




class _Lap:
    """Records the time since the previous lap under a step name."""

    def __init__(self, into: dict[str, float]) -> None:
        self._into = into
        self._last = time.perf_counter()

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self._into[step] = (now - self._last) * 1e3
        self._last = now


def _zeros(nbytes: int):
    import numpy as np

    return np.zeros(nbytes, dtype=np.uint8)


def _whole(value: Any, name: str) -> int:
    """``value`` as an int (numpy integers too; never a bool).

    Raises:
        WindowError: not a whole number.
    """
    if isinstance(value, bool):
        raise WindowError(f"{name}={value!r}: give a whole number, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise WindowError(f"{name}={value!r}: give a whole number") from None


def _user_slot(slot: Any) -> int:
    """``slot`` as one of the users' signal words.

    Raises:
        WindowError: not a whole number, or a word of ipcshare's own.
    """
    slot = _whole(slot, "slot")
    if not USER_SLOT_BASE <= slot < ERROR_SLOT:
        raise WindowError(
            f"signal slot {slot} is not a user's: words 0..{USER_SLOT_BASE - 1} are the "
            f"barrier's and {ERROR_SLOT}..{PAD_WORDS - 1} ipcshare's kernels'; user signals "
            f"take slots {USER_SLOT_BASE}..{ERROR_SLOT - 1} (USER_SLOT_BASE + 0.."
            f"{ERROR_SLOT - USER_SLOT_BASE - 1})")
    return slot
