"""``Group`` (world + backend + exchange) and ``Window`` (one symmetric buffer per rank,
plus a signal pad, mapped in every process of the node)."""

from __future__ import annotations

import contextlib
import platform
import secrets
import time
from typing import TYPE_CHECKING, Any

from .backends import Allocation, Backend, Buffer, gpu_count, open_backend
from .config import (
    BACKENDS,
    EXCHANGES,
    HANDLES,
    format_size,
    seconds_from_env,
    shared_gpu_barrier,
)
from .consensus import collective_step
from .errors import BackendUnavailable, ConfigError, SignalTimeout, WindowError
from .exchange import Exchange, OwnedFd
from .exchange.node_reach import PID_NAMESPACE_FIX
from .peer_paths import (
    CHUNK_ENV,
    FALLBACK_ENV,
    PathPlan,
    all_direct,
    chunk_bytes_choice,
    env_choices,
    fallback_choice,
    plan_paths,
)
from .peer_watch import PeerWatch, watched_allgather, watched_barrier
from .topology import World, describe_disagreement

if TYPE_CHECKING:
    from .collectives import Communicator

__all__ = ["Group", "Window", "StreamWindow", "SIGNAL_PAD_BYTES", "BARRIER_SLOTS",
           "USER_SLOT_BASE", "USER_SLOTS", "ERROR_SLOT", "KERNEL_SLOT_BASE",
           "DEVICE_BARRIER_SLOT_BASE", "EPOCH_SLOT_BASE", "FLAG_BARRIER_SLOT_BASE",
           "LL_EPOCH_SLOT"]

# Signal pad: 8192 64-bit words after the data (layout shared with the CUDA header
# kernels/include/ipcshare/signal.cuh). Words [0, 256) belong to the host barrier (word i
# is written only by local rank i); [256, 511) are free for patterns and users; word 511
# is where a kernel that gave up records why; [512, 8192) belong to ipcshare's kernels.
# One writer per word means no atomics are needed, only ordered stores.
SIGNAL_PAD_BYTES = 65536
BARRIER_SLOTS = 256
USER_SLOT_BASE = BARRIER_SLOTS
ERROR_SLOT = 511
USER_SLOTS = ERROR_SLOT - USER_SLOT_BASE
KERNEL_SLOT_BASE = 512
# Inside the kernels' range: the device barrier kernel's words (one per local rank), and
# the device-side epochs of ipcshare's kernel families (kEpochWordBase in the header).
DEVICE_BARRIER_SLOT_BASE = 8000
EPOCH_SLOT_BASE = 8064
# Graph-safe barriers of ranks sharing a GPU: two sets of one word per local rank, used in
# turn (Engine.make_flag_barrier), just below the device barrier's words.
FLAG_BARRIER_SLOT_BASE = 7872
FLAG_BARRIER_RANKS = 64
_DEVICE_BARRIER_EPOCH_SLOT = EPOCH_SLOT_BASE + 4
# The low-latency collectives count their own calls (their buffers alternate by it).
LL_EPOCH_SLOT = EPOCH_SLOT_BASE + 6
_PAD_ALIGN = 4096
_DEFAULT_SIGNAL_TIMEOUT_S = 30.0
# Flag-based barriers need stores that become visible in program order.
_ORDERED_HOST_STORES = platform.machine().lower() in ("x86_64", "amd64")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _spell_nbytes(nbytes: Any) -> str:
    """``nbytes=2097152 (2M)``: the argument as given, then its size where that reads
    shorter."""
    text = f"nbytes={nbytes!r}"
    if isinstance(nbytes, int) and not isinstance(nbytes, bool) and nbytes > 0:
        short = format_size(nbytes)
        if short != str(nbytes):
            text += f" ({short})"
    return text


def _check_same_arguments(given: list[dict[str, str]]) -> None:
    """Raise unless every rank passed the same ``exchange`` and ``handle`` (``given``:
    each rank's arguments, by rank): ranks on different paths would wait for each other
    in different calls. Backends may differ as long as they resolve alike."""
    for name in ("exchange", "handle"):
        values = [arguments[name] for arguments in given]
        if any(value != values[0] for value in values):
            raise ConfigError(f"ranks disagree on the {name}: " + describe_disagreement(
                values, verb=("passes", "pass"), spell=lambda value, name=name:
                f"{name}={value!r}"))


def _check_same_backend(choices: list[tuple[str, str]]) -> None:
    """Raise unless every rank resolved to the same backend; ``choices`` holds each
    rank's ``(backend argument, backend chosen)``."""
    if all(chosen == choices[0][1] for _given, chosen in choices):
        return
    hint = " (a GPU missing on one node?)" if all(given == "auto" for given, _ in choices) else ""
    raise ConfigError("ranks chose different backends: " + describe_disagreement(
        choices, verb=("passes", "pass"), spell=lambda choice: f"backend={choice[0]!r}"
        + (f", which chose {choice[1]!r}" if choice[0] != choice[1] else "")) + hint)


def _refuse_legacy_ipc_across_pid_namespaces(exchange: Exchange) -> None:
    """Legacy CUDA IPC handles do not open in another PID namespace: measured on H200s
    (driver 580), cuIpcOpenMemHandle returns CUDA_ERROR_INVALID_CONTEXT there. Say so
    before any allocation, on every rank of the node alike (docs/RELIABILITY.md)."""
    layout = exchange.pid_namespace_layout()
    if layout:
        raise BackendUnavailable(
            f"legacy CUDA IPC (backend cuda-ipc) does not work across PID namespaces "
            f"({layout}): cuIpcOpenMemHandle fails there with CUDA_ERROR_INVALID_CONTEXT; "
            f"use backend cuda-vmm, whose POSIX-FD handles travel over unix sockets, or "
            f"{PID_NAMESPACE_FIX}")


def _check_same_p2p_choices(choices: list[tuple[Any, Any]], ranks: list[int]) -> None:
    """Raise unless the ranks of a node (world ``ranks``) chose the same ``(p2p_fallback,
    p2p_chunk)``, each the argument or else its environment variable (empty: unset)."""
    for index, (name, variable) in enumerate((("p2p_fallback", FALLBACK_ENV),
                                              ("p2p_chunk", CHUNK_ENV))):
        values = [choice[index] for choice in choices]
        if any(value != values[0] for value in values):
            raise ConfigError(
                f"ranks of a node disagree on {name} (the argument, else {variable}): "
                + describe_disagreement(values, ranks=ranks, spell=lambda value:
                                        "nothing" if value in ("", None) else repr(value)))


def _signal_timeout() -> float:
    return seconds_from_env("IPCSHARE_SIGNAL_TIMEOUT", _DEFAULT_SIGNAL_TIMEOUT_S)


def resolve_backend_name(name: str) -> str:
    """``auto`` -> ``cuda-vmm`` when a GPU is visible here, else ``host``."""
    if name != "auto":
        return name
    count, _reason = gpu_count()
    return "cuda-vmm" if count > 0 else "host"


class Group:
    """The ranks of a communicator, sharing memory through one backend.

    Collective over ``comm`` (default ``MPI.COMM_WORLD``): every rank must create it
    with the same arguments. ``host_placement`` (this rank's rank and rank count on its
    machine, which device binding goes by) is for a group over part of a job whose
    placement an enclosing group knows (``World.from_comm``).

    Raises:
        ConfigError: unknown backend or exchange name (on every rank).
        BackendUnavailable: the backend cannot run on some rank (on every rank).
    """

    def __init__(self, backend: str = "auto", exchange: str = "auto", *, comm: Any = None,
                 handle: str = "posix-fd", timeout: float | None = None,
                 p2p_fallback: str | None = None, p2p_chunk: int | str | None = None,
                 host_placement: tuple[int, int] | None = None) -> None:
        self.world = World.from_comm(comm, host_placement=host_placement)
        # How each pair of the node's ranks reaches the other (peer_paths); all direct
        # until the GPUs say otherwise.
        self.paths: PathPlan = all_direct(self.world.local_ranks)
        # Whether some node of the job has a pair without peer access: then every rank
        # joins the pinned-inbox exchange of each window (a job-wide collective).
        self.fallbacks_anywhere = False
        self.backend: Backend | None = None
        # GPU UUID -> the node's world ranks on it, for GPUs that more than one rank uses.
        # The same on every rank of the node: barriers and algorithms choose by it.
        self.shared_gpus: dict[str, list[int]] = {}
        self.exchange: Exchange | None = None
        self._windows: list[Window] = []
        self._closed = False
        # Every wait on a peer (collectives, signals, sockets) asks this watch, so a rank
        # that dies is named at once instead of hanging the others.
        self.watch: PeerWatch | None = None
        try:
            self.watch = PeerWatch.open(self.world)
            with collective_step(self.world, "group setup"):
                if backend not in BACKENDS:
                    raise ConfigError(
                        f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
                if exchange not in EXCHANGES:
                    raise ConfigError(
                        f"unknown exchange {exchange!r}; choose one of: {', '.join(EXCHANGES)}")
                if handle not in HANDLES:
                    raise ConfigError(
                        f"unknown handle type {handle!r}; choose one of: {', '.join(HANDLES)}")
                self.exchange = Exchange(self.world, exchange, timeout=timeout,
                                         watch=self.watch)
                self.signal_timeout = _signal_timeout() if timeout is None else timeout
                chosen = resolve_backend_name(backend)
            # Rank 0's token names this job in every handle and socket.
            facts = self.collective("backend choice", (
                {"backend": backend, "exchange": exchange, "handle": handle}, chosen,
                secrets.token_hex(8)))
            self.exchange._token = facts[0][2]
            with self.step("group setup"):
                _check_same_arguments([given for given, _chosen, _token in facts])
            with self.step("backend setup"):
                _check_same_backend([(given["backend"], choice) for given, choice, _ in facts])
                # Devices and cores are the machine's: bind by the rank on this host,
                # which is the node-local rank unless virtual nodes split the host.
                self.backend = open_backend(chosen, local_rank=self.world.host_rank,
                                            local_size=self.world.host_size, handle=handle)
                self.backend.engine().peer_check = self.watch.check
            with self.step("backend setup"):
                if chosen == "cuda-ipc" and self.world.local_size > 1:
                    _refuse_legacy_ipc_across_pid_namespaces(self.exchange)
            # Launch wrappers often give each rank its own CUDA_VISIBLE_DEVICES, so device
            # ordinals say nothing about sharing: count the ranks holding the same GPU UUID.
            uuid = getattr(self.backend, "uuid", None)
            uuids = self.collective("device choice", uuid, comm=self.world.local_comm)
            if uuid is not None:
                self.backend.ranks_per_device = uuids.count(uuid)
                self.shared_gpus = {
                    device: [rank for rank, other in zip(self.world.local_ranks, uuids,
                                                         strict=True) if other == device]
                    for device in dict.fromkeys(uuids) if uuids.count(device) > 1}
                self.backend.engine().timeout = self.signal_timeout
                self._plan_peer_paths(uuids, p2p_fallback, p2p_chunk)
            if self.backend.uses_fds and self.world.size > 1:  # collective, like a window's
                self.exchange.warm_up()
        except BaseException:
            self._release()
            raise

    def _plan_peer_paths(self, uuids: list, fallback: str | None, chunk: int | str | None) -> None:
        """Gather which GPUs of the node reach which, and plan every pair's path (the
        same plan on every rank of the node)."""
        from . import devices

        world, backend = self.world, self.backend
        assert backend is not None
        with self.step("peer access"):
            reach = devices.peer_reach(backend.device, uuids)
            env_fallback, env_chunk = env_choices()
            choices = (env_fallback if fallback is None else fallback,
                       env_chunk if chunk is None else chunk)
        facts = self.collective("peer access", (reach, choices, f"cuda:{backend.device}"),
                                comm=world.local_comm)
        with self.step("peer paths"):
            _check_same_p2p_choices([fact[1] for fact in facts], world.local_ranks)
            self.paths = plan_paths(
                world.local_ranks, [fact[2] for fact in facts],
                [[ok for ok, _why in fact[0]] for fact in facts],
                [[why for _ok, why in fact[0]] for fact in facts],
                fallback=fallback_choice(choices[0]), chunk_bytes=chunk_bytes_choice(choices[1]))
        self.fallbacks_anywhere = any(self.collective("peer paths", self.paths.has_fallbacks))

    @property
    def rank(self) -> int:
        return self.world.rank

    def step(self, name: str):
        """``collective_step`` that gives up on a dead peer or at the exchange timeout."""
        assert self.exchange is not None
        return collective_step(self.world, name, watch=self.watch, timeout=self.exchange.timeout)

    def collective(self, what: str, value, *, comm=None) -> list:
        """Collective allgather over ``comm`` (default: the group's) that gives up on a
        dead peer (PeerDied) or at the exchange timeout (ExchangeTimeout)."""
        assert self.exchange is not None
        return watched_allgather(self.world.comm if comm is None else comm, value,
                                 watch=self.watch, timeout=self.exchange.timeout, what=what)

    def wait_for_node(self, what: str) -> None:
        """Barrier over the node's ranks, skipped once the group has failed (a dead
        peer would never arrive)."""
        if self.watch is not None and self.watch.failed:
            return
        timeout = self.exchange.timeout if self.exchange is not None else 30.0
        watched_barrier(self.world.local_comm, watch=self.watch, timeout=timeout, what=what)

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def backend_name(self) -> str:
        assert self.backend is not None
        return self.backend.name

    @property
    def exchange_name(self) -> str:
        """How handles travelled: ``pidfd``, ``socket`` (descriptors) or ``mpi`` (bytes)."""
        assert self.exchange is not None and self.backend is not None
        return self.exchange.name if self.backend.uses_fds else "mpi"

    def window(self, nbytes: int) -> Window:
        """Collective: allocate, export, exchange, import and map ``nbytes`` on every rank.

        Every rank must pass the same ``nbytes``.

        Raises:
            WindowError: ranks disagree on the size, or the group is closed.
            BackendError / ExchangeError: a step failed on some rank (raised on all).
        """
        if self._closed:
            raise WindowError("group is closed")
        window = Window(self, nbytes)
        self._windows.append(window)
        return window

    def communicator(self, max_bytes: int, *, heap_bytes: int | None = None) -> Communicator:
        """Collective: a ``Communicator`` for all-gather, all-reduce and reduce-scatter
        on the user's arrays, whose calls move at most ``max_bytes`` (the largest array
        of a call), with ``heap_bytes`` (default ``2 * max_bytes``) for ``empty()``. Its
        window is sized once here and closed with the group.

        Raises:
            CollectiveError: bad or disagreeing sizes (on every rank).
            Unsupported: a backend or layout that has no collectives yet (on every rank).
            WindowError: the group is closed.
        """
        if self._closed:
            raise WindowError("group is closed")
        # The collectives layer sits above windows: imported only when asked for.
        from .collectives import Communicator

        return Communicator(self, max_bytes, heap_bytes=heap_bytes)

    def barrier(self) -> None:
        """Collective, host-blocking: an MPI barrier over the group.

        Raises:
            PeerDied / ExchangeTimeout: a rank died or did not come in time.
        """
        watched_barrier(self.world.comm, watch=self.watch, timeout=self.exchange.timeout,
                        what="group barrier")

    def _forget(self, window: Window) -> None:
        with contextlib.suppress(ValueError):
            self._windows.remove(window)

    def close(self) -> None:
        """Close every window, the exchange and the backend. Idempotent; collective."""
        if self._closed:
            return
        self._closed = True
        try:
            errors = []
            for window in reversed(list(self._windows)):
                try:
                    window.close()
                except Exception as exc:  # close the others anyway; report the first
                    errors.append(exc)
            if errors:
                raise errors[0]
        finally:
            self._release()

    def _release(self) -> None:
        try:
            if self.exchange is not None:
                self.exchange.close()
        finally:
            self.exchange = None
            try:
                if self.backend is not None:
                    self.backend.close()
                    self.backend = None
            finally:
                if self.watch is not None:
                    self.watch.close()
                self.world.close()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Window:
    """One symmetric buffer per rank and a signal pad after it, mapped on every rank of
    the node. Created by ``Group.window``; ``close()`` is idempotent and collective."""

    def __init__(self, group: Group, nbytes: int) -> None:
        assert group.backend is not None and group.exchange is not None
        self.group = group
        world = self.world = group.world
        backend = group.backend
        self.engine = backend.engine()
        self._closed = False
        self._barrier = None
        # Stream-ordered barriers on the same pad words share one epoch, whatever stream
        # they run on; keyed by stream handle (None: the engine's own stream).
        self._barrier_epochs = [0]
        self._stream_barriers: dict[Any, Any] = {}
        self._device_barriers: dict[Any, Any] = {}
        self._flag_barrier_turn = [0]
        self._node_barrier = None
        self._allocations: dict[int, Allocation] = {}
        # Milliseconds this rank spent in each setup step (the table header shows them).
        self.setup_ms: dict[str, float] = {}
        lap = _Lap(self.setup_ms)
        sizes = group.collective("window rendezvous", nbytes)
        with group.step("window rendezvous"):
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                raise WindowError(f"window size must be a non-negative int, got {nbytes!r}")
            if any(size != sizes[0] for size in sizes):
                raise WindowError("ranks disagree on the window size: " + describe_disagreement(
                    sizes, verb=("passes", "pass"), spell=_spell_nbytes))
            if world.local_size > BARRIER_SLOTS:
                raise WindowError(f"{world.local_size} ranks on one node; at most {BARRIER_SLOTS}")
        self.nbytes = nbytes
        self.pad_offset = _round_up(nbytes, _PAD_ALIGN)
        # Pairs of the node without peer access copy through relays and host memory
        # (backends.staged_copy): every window of such a node keeps a staging area after
        # its pad for the pairs it may relay.
        self.paths: PathPlan = group.paths
        self.staged: Any = None
        self._host_barrier_epochs = [0]
        self.relay_offset = _round_up(self.pad_offset + SIGNAL_PAD_BYTES, _PAD_ALIGN)
        self._relay_bytes = 0
        self._slot_bytes = 0
        if self.paths.has_fallbacks:
            from .backends.staged_copy import relay_staging_bytes, slot_bytes_for

            self._slot_bytes = slot_bytes_for(nbytes, self.paths.chunk_bytes)
            self._relay_bytes = relay_staging_bytes(self.paths, self._slot_bytes)
        self.total_bytes = _round_up(self.relay_offset + self._relay_bytes, backend.granularity)
        with contextlib.ExitStack() as undo:
            lap("rendezvous")
            with group.step("allocate"):
                capacity = backend.capacity_bytes()
                needed = self.total_bytes * world.host_size
                if capacity is not None and needed > capacity:
                    raise WindowError(
                        f"a window of {format_size(nbytes)} bytes on each of the node's "
                        f"{world.host_size} ranks needs {format_size(needed)} bytes, more than "
                        f"the {format_size(capacity)} bytes available: choose a smaller size")
                local = backend.allocate(self.total_bytes)
                undo.callback(local.close)
                self._allocations[world.rank] = local
            exported = None
            lap("allocate")
            with group.step("export"):
                exported = backend.export(local)
                undo.callback(exported.close)
                # Zero the pad before any peer can see it, so stale flags never leak in.
                self.engine.upload(local.buffer(self.pad_offset, SIGNAL_PAD_BYTES),
                                   _zeros(SIGNAL_PAD_BYTES))
                self.engine.synchronize()
            lap("export")
            with group.step("handle exchange"):
                payloads = group.exchange.share_bytes(exported.payload, kind=backend.name)
            fds: dict[int, OwnedFd] = {}
            if backend.uses_fds and world.size > 1:  # every rank joins: it agrees world-wide
                fds = group.exchange.share_fds(exported.fd)  # collective, agrees itself
                for owned in fds.values():
                    undo.callback(owned.close)
            lap("exchange")
            with group.step("import"):
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
            if group.fallbacks_anywhere:  # every rank joins: the inbox exchange is job-wide
                self.staged = self._open_staged(undo)
                lap("fallback setup")
            undo.pop_all()
        self._local_buffer = local.buffer(0, nbytes)
        self._buffers = {r: a.buffer(0, nbytes) for r, a in self._allocations.items()}
        self._pads = {r: a.buffer(self.pad_offset, SIGNAL_PAD_BYTES)
                      for r, a in self._allocations.items()}

    def _open_staged(self, undo: contextlib.ExitStack) -> Any:
        """Collective over the job: every rank makes a pinned inbox and passes it to its
        node's peers; each rank maps the inboxes of the peers it cannot map and keeps
        them in a StagedCopy (None where this rank has no such peer)."""
        from .backends.pinned_host import create_pinned, open_peer_pinned
        from .backends.staged_copy import StagedCopy, inbox_bytes

        group, world, plan = self.group, self.world, self.paths
        device = group.backend.device
        size = inbox_bytes(plan, self._slot_bytes)
        peers = plan.indirect_peers(world.rank)
        with group.step("pinned inbox"):
            inbox, inbox_fd = create_pinned(size, device, what=f"pinned inbox of {world.where()}")
            undo.callback(inbox.close)
            undo.callback(inbox_fd.close)
        fds = group.exchange.share_fds(inbox_fd)  # collective over the node, agrees job-wide
        inbox_fd.close()
        for owned in fds.values():
            undo.callback(owned.close)
        with group.step("pinned inbox import"):
            peer_inboxes = {}
            for rank in peers:
                peer_inboxes[rank] = open_peer_pinned(
                    fds[rank], size, device, what=f"pinned inbox of {world.where(rank)}")
                undo.callback(peer_inboxes[rank].close)
            for owned in fds.values():
                owned.close()
            if not peers:
                inbox.close()  # nobody writes into it: no peer of ours goes through staging
                return None
            relays = {plan.path(world.rank, r).relay for r in peers} - {None}
            staged = StagedCopy(
                engine=self.engine, world=world, plan=plan, inbox=inbox,
                peer_inboxes=peer_inboxes,
                relay_areas={k: self._allocations[k].buffer(self.relay_offset, self._relay_bytes)
                             for k in relays},
                slot_bytes=self._slot_bytes, timeout=group.signal_timeout)
            undo.callback(staged.close)
        return staged

    # -- the API of DESIGN.md -------------------------------------------------------
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
        """Write ``value`` into word ``slot`` of rank ``rank``'s pad, after this rank's
        earlier writes (release). Slots ``USER_SLOT_BASE`` and up are free for users.

        On GPU windows the store is enqueued on ``stream`` (default: the window's own;
        see ``on_stream`` for what a stream may be)."""
        self._check_slot(slot)
        self._engine_on(stream).store_signal(self.signal_pad(rank), slot, value)

    def wait_signal(self, slot: int, value: int, *, peer: int | None = None,
                    timeout: float | None = None, stream: Any = None) -> None:
        """Wait until word ``slot`` of this rank's pad is >= ``value`` (acquire).

        On GPU windows the wait is enqueued on ``stream`` (default: the window's own) and
        the host does not block; a synchronize after ``timeout`` raises instead of hanging.

        Raises:
            SignalTimeout: naming ``peer`` (the rank expected to signal) and the slot.
        """
        self._check_slot(slot)
        who = f"waiting for {self.world.where(peer)}" if peer is not None else "waiting"
        self._engine_on(stream).wait_signal(
            self._pads[self.world.rank], slot, value,
            timeout=self.group.signal_timeout if timeout is None else timeout,
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
        if stream is not None:
            engine = self._engine_on(stream)
            if engine is not self.engine:
                key = int(engine.stream)
                if key not in self._stream_barriers:
                    self._stream_barriers[key] = self._make_barrier(engine)
                self._stream_barriers[key]()
                return
        if self._barrier is None:
            self._barrier = self._make_barrier(self.engine)
        self._barrier()

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
        if not hasattr(self.group.backend, "kernels"):
            raise WindowError(f"device_barrier runs a kernel: a {self.group.backend_name} "
                              "window has none (use barrier())")
        engine = self._engine_on(stream)
        key = int(engine.stream)
        if key not in self._device_barriers:
            self._device_barriers[key] = self._make_device_barrier(engine)
        self._device_barriers[key]()

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
        engine = self._engine_on(stream)
        if graph_safe and self.group.shared_gpus:
            barrier = self._make_graph_flag_barrier(engine)
        elif graph_safe:
            if not hasattr(self.group.backend, "kernels"):
                raise WindowError("a graph-safe view runs device_barrier, a kernel: a "
                                  f"{self.group.backend_name} window has none")
            # Compile and load the kernel now: module loading has no place in a capture.
            key = int(engine.stream)
            if key not in self._device_barriers:
                self._device_barriers[key] = self._make_device_barrier(engine)

            def barrier() -> None:
                self.device_barrier(engine.stream)
        else:
            def barrier() -> None:
                self.barrier(engine.stream)
        return StreamWindow(self, engine, barrier, graph_safe=graph_safe)

    def _make_graph_flag_barrier(self, engine: Any) -> Any:
        """The graph-safe barrier where ranks share a GPU: fixed-value stream memory
        operations in two alternating sets of pad words (a replay repeats the same
        operations). The device barrier kernel would spin on a peer's flag while holding a
        time-shared GPU that the peer needs: 4.5 ms per all-gather on 2 H200s shared by 3
        ranks (docs/GPU.md, "Several ranks on one GPU").

        Raises:
            WindowError: more than FLAG_BARRIER_RANKS ranks on the node.
        """
        world = self.world
        if world.local_size > FLAG_BARRIER_RANKS:
            raise WindowError(f"graph-safe barriers of ranks sharing a GPU span at most "
                              f"{FLAG_BARRIER_RANKS} ranks of a node; this node has "
                              f"{world.local_size}")
        self._refuse_without_direct_peers("a graph-safe barrier")
        others = self.paths.direct_peers(world.rank)

        def what(slot: int) -> str:
            rank = world.local_ranks[slot % FLAG_BARRIER_RANKS]
            return f"{world.where()} in a graph barrier waiting for {world.where(rank)}"
        barriers = []
        for turn in range(2):
            base = FLAG_BARRIER_SLOT_BASE + turn * FLAG_BARRIER_RANKS
            barriers.append(engine.make_flag_barrier(
                self._pads[world.rank], [self._pads[r] for r in others],
                base + world.local_rank, [base + world.local_index(r) for r in others],
                timeout=self.group.signal_timeout, what=what))
        turn = self._flag_barrier_turn  # one alternation for every view of the window

        def barrier() -> None:
            barriers[turn[0]]()
            turn[0] ^= 1
        return barrier

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
        if not hasattr(self.group.backend, "kernels"):
            return
        word = self.engine.download(self.signal_pad(self.rank).slice(ERROR_SLOT * 8, 8))
        code = int(word.view("<u8")[0])
        if code:
            peer = self.world.local_ranks[(code >> 48) - 1]
            raise SignalTimeout(
                f"{self.world.where()}: {what} gave up waiting for {self.world.where(peer)} "
                f"(epoch {code & 0xFFFFFFFFFFFF}) after {self.group.signal_timeout / 2:g} s")

    def _engine_on(self, stream: Any) -> Any:
        if stream is None:
            return self.engine
        if not hasattr(self.engine, "on_stream"):
            raise WindowError(f"a {self.group.backend_name} window has no CUDA streams: "
                              "call without stream=")
        return self.engine.on_stream(stream)

    def _make_device_barrier(self, engine: Any):
        from .kernels.launcher import MAX_KERNEL_RANKS, BarrierArgs

        world, backend = self.world, self.group.backend
        self._refuse_without_direct_peers("device_barrier")
        if world.local_size > MAX_KERNEL_RANKS:
            raise WindowError(f"device_barrier spans at most {MAX_KERNEL_RANKS} ranks of a "
                              f"node; this node has {world.local_size}")
        args = BarrierArgs()
        for index, rank in enumerate(world.local_ranks):
            args.pads[index] = self._pads[rank].ptr
        args.timeout_ns = int(self.group.signal_timeout * 0.5e9)
        args.rank, args.nranks = world.local_rank, world.local_size
        args.slot_base, args.epoch_word = DEVICE_BARRIER_SLOT_BASE, _DEVICE_BARRIER_EPOCH_SLOT
        return backend.kernels("barrier.cu").launcher(
            "device_barrier", args, grid=1, block=32, stream=engine.stream)

    def node_barrier(self) -> None:
        """Collective over this node's ranks only (no MPI call where host stores are
        ordered): returns once each of them entered it, their earlier window writes
        visible. On a GPU the barrier is stream-ordered: the host does not wait."""
        self._check_open()
        if self._node_barrier is None:
            self._node_barrier = self._make_node_barrier(self.engine)
        self._node_barrier()

    def _make_node_barrier(self, engine: Any):
        world = self.world
        if not _ORDERED_HOST_STORES and self.group.backend_name == "host":
            return world.local_comm.Barrier
        if self.group.shared_gpus and shared_gpu_barrier() == "host":
            return self._make_host_synchronised_barrier(engine)
        others = self.paths.direct_peers(world.rank)

        def what(slot: int) -> str:
            return f"{world.where()} in barrier waiting for {world.where(world.local_ranks[slot])}"
        # Device engines may run barriers on several streams: one epoch for all of them.
        shared = {"epochs": self._barrier_epochs} if hasattr(engine, "on_stream") else {}
        through_pads = engine.make_barrier(
            self._pads[world.rank], [self._pads[r] for r in others], world.local_rank,
            [world.local_index(r) for r in others], timeout=self.group.signal_timeout,
            what=what, **shared)
        if self.staged is None:
            return through_pads
        # Peers whose pads we cannot map meet us in the pinned inboxes instead: the same
        # one word per local rank, in host memory both GPUs reach. Pad words first, then
        # inbox words, on every rank alike, so neither half waits on the other.
        staged = self.staged.peers
        through_inboxes = engine.make_barrier(
            self.staged.own_words, [self.staged.words_of(r) for r in staged], world.local_rank,
            [world.local_index(r) for r in staged], timeout=self.group.signal_timeout,
            what=what, epochs=self._host_barrier_epochs)

        def barrier() -> None:
            through_pads()
            through_inboxes()
        return barrier

    def _make_host_synchronised_barrier(self, engine: Any):
        """The node barrier when ranks share a GPU: wait for our stream, then meet on the
        host. Without MPS the contexts of one GPU take turns in time slices, and a stream
        that waits on a peer's flag holds its turn while the peer, on the same GPU, cannot
        run to write it (docs/GPU.md, "Several ranks on one GPU"). The host blocks."""
        world, group = self.world, self.group

        def barrier() -> None:
            engine.synchronize()  # our writes into peers' windows have landed
            watched_barrier(world.local_comm, watch=group.watch, timeout=group.signal_timeout,
                            what=f"{world.where()} in a barrier (ranks share a GPU)")
        return barrier

    def _refuse_without_direct_peers(self, what: str) -> None:
        """Raise WindowError when some pair of the node is not direct (naming it): ``what``
        needs every peer's memory mapped. The plan is the node's, so every rank of the
        node refuses alike."""
        plan = self.paths
        if not plan.has_fallbacks:
            return
        pair = min(tuple(sorted(p)) for p in plan.indirect)
        a, b = pair
        raise WindowError(
            f"{what} needs every peer's window mapped, but rank {a} ({plan.label(a)}) and "
            f"rank {b} ({plan.label(b)}) have no peer access ({plan.path(a, b).reason}; "
            f"their path is {plan.kind(a, b)}): use barrier() and the copy engine instead")

    def _make_barrier(self, engine: Any):
        world = self.world
        if not _ORDERED_HOST_STORES and self.group.backend_name == "host":
            return world.comm.Barrier
        if engine is not self.engine:
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

    def close(self) -> None:
        """Unmap peers and free this rank's memory. Idempotent; collective (it waits for
        the node's ranks so nobody's memory goes while a peer may still touch it)."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                self.engine.synchronize()
                if self.staged is not None:  # lanes another stream's work left running
                    self.staged.drain(self.group.signal_timeout)
            finally:
                # Even when our stream failed, the peers are waiting in this barrier.
                self.group.wait_for_node("closing a window")
        finally:
            staged, self.staged = self.staged, None
            try:
                if staged is not None:  # lanes and inboxes first: they use the mappings
                    staged.close()
            finally:
                self._buffers.clear()
                self._pads.clear()
                self._local_buffer = None
                self._barrier = None
                self._stream_barriers.clear()
                self._device_barriers.clear()
                self._node_barrier = None
                for rank in sorted(self._allocations, key=lambda r: r == self.world.rank):
                    self._allocations[rank].close()  # peers' mappings first, own memory last
                self._allocations.clear()
                self.group._forget(self)

    def __enter__(self) -> Window:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise WindowError("window is closed")

    def _check_in_group(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world.size:
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

    @staticmethod
    def _check_slot(slot: int) -> None:
        if not 0 <= slot < SIGNAL_PAD_BYTES // 8:
            last = SIGNAL_PAD_BYTES // 8 - 1
            raise WindowError(f"signal slot {slot} outside the pad (0..{last})")


class StreamWindow:
    """A window whose GPU work goes to another stream (``Window.on_stream``): ``engine``
    enqueues there and ``barrier`` runs there; buffers, pads and ranks are the window's.
    Compares and hashes equal to its window, so per-window state is shared."""

    def __init__(self, window: Window, engine: Any, barrier: Any, *,
                 graph_safe: bool = False) -> None:
        self.window = window
        self.engine = engine
        self.barrier = barrier
        # Work bound to this view is meant for a CUDA graph (patterns may choose by it).
        self.graph_safe = graph_safe

    @property
    def stream(self) -> Any:
        """The ``CUstream`` this view enqueues on."""
        return self.engine.stream

    def __getattr__(self, name: str) -> Any:
        if name == "window":  # not set yet (a copy in the making): no recursion
            raise AttributeError(name)
        return getattr(self.window, name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StreamWindow):
            other = other.window
        return other is self.window

    def __hash__(self) -> int:
        return hash(self.window)

    def __repr__(self) -> str:
        return f"StreamWindow({self.window!r}, stream={self.stream!r})"


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


