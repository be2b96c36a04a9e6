"""``Group``: the ranks of a communicator (the world), the memory backend they share,
the exchange that carries their handles, and the plan of how each pair of a node
reaches the other. Windows are made from what a group settled once."""

from __future__ import annotations

import contextlib
import secrets
from typing import TYPE_CHECKING, Any

from ..backends import Backend, open_backend, resolve_backend_name
from ..exchange import Exchange
from ..exchange.node_reach import PID_NAMESPACE_FIX
from ..liveness.consensus import Rendezvous, collective_step
from ..liveness.deadline_waits import DeadlineComm, first_meeting_patience
from ..liveness.exit_policy import leave_without_finalize_at_exit
from ..liveness.pidfd_watch import PeerWatch
from ..runtime import settings
from ..runtime.config import BACKENDS, EXCHANGES, HANDLES
from ..runtime.errors import BackendUnavailable, ConfigError, ExchangeTimeout, WindowError
from ..topology.gpu_sharing import gpu_sharing
from ..topology.peer_paths import (
    CHUNK_ENV,
    FALLBACK_ENV,
    PathPlan,
    all_direct,
    chunk_bytes_choice,
    env_choices,
    fallback_choice,
    plan_paths,
)
from ..topology.world import World, describe_disagreement
from .setting_checks import check_settings
from .window import Window

if TYPE_CHECKING:
    from ..collectives import Communicator

__all__ = ["Group"]



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
        # A rank still waiting for the others to arrive after the group's timeout says
        # so (a malformed timeout is refused below, once every rank is here).
        try:
            self.world = World.from_comm(comm, host_placement=host_placement,
                                         warn_after=(timeout if timeout is not None
                                                     and settings.duration_problem(timeout)
                                                     is None else None))
        except ExchangeTimeout as exc:
            stopped = getattr(exc, "stopped_pids", None)
            if stopped:
                # A stopped rank was given up on: it cannot answer MPI_Finalize, and
                # nobody else will continue it (exit_policy).
                leave_without_finalize_at_exit(str(exc), stopped_pids=stopped)
            raise
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
        # Those of them that take turns in time slices (some rank on it is not an MPS
        # client): where a wait on the GPU for a peer can last a time slice. Communicators
        # choose by this one; windows and patterns treat every shared GPU alike, MPS or
        # not (docs/GPU.md, "Several ranks on one GPU").
        self.time_sliced_gpus: dict[str, list[int]] = {}
        self.exchange: Exchange | None = None
        self._windows: list[Window] = []
        # Closed before the windows: a communicator's views of its window go with it, so
        # the memory is unmapped when the group closes, not when the communicator is
        # collected.
        self._communicators: list[Any] = []
        self._closed = False
        # Whether a call of this group's communicators failed on this rank: then its MPI
        # communicators are kept, not freed, at close (``note_failed_call``).
        self._failed_call = False
        # What a node group of this one is made with too (``node_group``).
        self._given = {"handle": handle, "timeout": timeout, "p2p_fallback": p2p_fallback,
                       "p2p_chunk": p2p_chunk}
        # Every wait on a peer (collectives, signals, sockets) asks this watch, so a rank
        # that dies is named at once instead of hanging the others.
        self.watch: PeerWatch | None = None
        try:
            self.watch = PeerWatch.open(self.world)
            # Before the group's own timeout is checked: a stopped or dead rank is given
            # up on after it (or the exchange timeout), a running one waited for as long
            # as ranks may take to arrive.
            with collective_step(self.world, "group setup", watch=self.watch,
                                 **first_meeting_patience(timeout)):
                if backend not in BACKENDS:
                    raise ConfigError(
                        f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
                if exchange not in EXCHANGES:
                    raise ConfigError(
                        f"unknown exchange {exchange!r}; choose one of: {', '.join(EXCHANGES)}")
                if handle not in HANDLES:
                    raise ConfigError(
                        f"unknown handle type {handle!r}; choose one of: {', '.join(HANDLES)}")
                problem = None if timeout is None else settings.duration_problem(timeout)
                if problem:  # the range the IPCSHARE_* durations take
                    raise ConfigError(f"timeout={timeout!r}: {problem}, or None for the "
                                      "IPCSHARE_* timeouts")
                self.exchange = Exchange(self.world, exchange, timeout=timeout,
                                         watch=self.watch)
                self.rendezvous = Rendezvous(self.world, self.watch, self.exchange.timeout)
                self.signal_timeout = (settings.signal_timeout() if timeout is None
                                       else timeout)
                check_settings(p2p_fallback, p2p_chunk)
                chosen = resolve_backend_name(backend)
            # Rank 0's token names this job in every handle and socket.
            facts = self.collective("backend choice", (
                {"backend": backend, "exchange": exchange, "handle": handle}, chosen,
                secrets.token_hex(8)))
            self.exchange.adopt_token(facts[0][2])
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
                if not self.backend.crosses_pid_namespaces and self.world.local_size > 1:
                    _refuse_legacy_ipc_across_pid_namespaces(self.exchange)
            # Launch wrappers often give each rank its own CUDA_VISIBLE_DEVICES, so device
            # ordinals say nothing about sharing: count the ranks holding the same GPU UUID.
            uuid = self.backend.uuid
            devices_of = self.collective("device choice", (uuid, self.backend.under_mps),
                                         comm=self.world.local_comm)
            uuids = [device for device, _mps in devices_of]
            if uuid is not None:
                self.backend.ranks_per_device = uuids.count(uuid)
                self.shared_gpus, self.time_sliced_gpus = gpu_sharing(self.world.local_ranks,
                                                                      devices_of)
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
        from ..topology import devices

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
                [[access.ok for access in fact[0]] for fact in facts],
                [[access.why for access in fact[0]] for fact in facts],
                fallback=fallback_choice(choices[0]), chunk_bytes=chunk_bytes_choice(choices[1]),
                disabled=[[access.disabled_by_setting for access in fact[0]] for fact in facts])
        self.fallbacks_anywhere = any(self.collective("peer paths", self.paths.has_fallbacks))

    @property
    def rank(self) -> int:
        return self.world.rank

    def step(self, name: str):
        """``collective_step`` that gives up on a dead peer or at the exchange timeout."""
        return self.rendezvous.step(name)

    def deadline_comm(self, label: str) -> DeadlineComm:
        """The world communicator's blocking collectives, each waiting at most the
        exchange timeout and giving up on a dead or stopped peer (``DeadlineComm``):
        for a command's own bookkeeping (barriers, sums, gathers) around the group's calls.
        """
        self._check_open()
        return DeadlineComm(self.world.comm, watch=self.watch, timeout=self.rendezvous.timeout,
                            label=label)

    def collective(self, what: str, value, *, comm=None) -> list:
        """Collective allgather over ``comm`` (default: the group's) that gives up on a
        dead peer (PeerDied) or at the exchange timeout (ExchangeTimeout)."""
        return self.rendezvous.collective(what, value, comm=comm)

    def wait_for_node(self, what: str) -> None:
        """Barrier over the node's ranks, skipped once the group has failed (a dead
        peer would never arrive)."""
        self.rendezvous.wait_for_node(what)

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def backend_name(self) -> str:
        self._check_open()
        assert self.backend is not None
        return self.backend.name

    @property
    def exchange_name(self) -> str:
        """How handles travelled: ``pidfd``, ``socket`` (descriptors) or ``mpi`` (bytes)."""
        self._check_open()
        assert self.exchange is not None and self.backend is not None
        return self.exchange.name if self.backend.uses_fds else "mpi"

    def _check_open(self) -> None:
        if self._closed:
            raise WindowError("group is closed")

    def window(self, nbytes: int) -> Window:
        """Collective: allocate, export, exchange, import and map ``nbytes`` on every rank.

        Every rank must pass the same ``nbytes``.

        Raises:
            WindowError: ranks disagree on the size, or the group is closed.
            WindowTooLarge: the node lacks the memory for it (raised on all).
            BackendError / ExchangeError: a step failed on some rank (raised on all).
        """
        self._check_open()
        assert self.backend is not None and self.exchange is not None
        window = Window(nbytes, world=self.world, backend=self.backend,
                        exchange=self.exchange, rendezvous=self.rendezvous, paths=self.paths,
                        fallbacks_anywhere=self.fallbacks_anywhere,
                        shared_gpus=self.shared_gpus, time_sliced_gpus=self.time_sliced_gpus,
                        signal_timeout=self.signal_timeout,
                        on_close=self._forget, group=self)
        self._windows.append(window)
        return window

    def communicator(self, max_bytes: int, *, heap_bytes: int | None = None,
                     inter: str = "auto") -> Communicator:
        """Collective: a ``Communicator`` for all-gather, all-reduce and reduce-scatter
        on the user's arrays, whose calls move at most ``max_bytes`` (the largest array
        of a call), with ``heap_bytes`` (default ``2 * max_bytes``) for ``empty()``. Its
        window is sized once here and closed with the group. A group spanning nodes gets
        a ``NodesCommunicator`` (IPC inside nodes; between them the engine ``inter``
        names: ``nccl``, ``mpi`` or ``auto``, as ``--inter``).

        Raises:
            CollectiveError: bad or disagreeing sizes (on every rank).
            Unsupported: a backend or layout that has no collectives yet (on every rank).
            WindowError: the group is closed.
        """
        self._check_open()
        # The collectives layer sits above windows: imported only when asked for.
        from ..collectives import Communicator

        if self.world.node_count > 1:
            from ..collectives.across_nodes.communicator import NodesCommunicator

            made: Communicator = NodesCommunicator(self, max_bytes, heap_bytes=heap_bytes,
                                                   inter=inter)
        else:
            made = Communicator(self, max_bytes, heap_bytes=heap_bytes)
        self._communicators.append(made)
        return made

    def node_group(self) -> Group:
        """Collective over the group: a group of this rank's node (its ranks only), on the
        same backend and GPU as this one; the caller closes it. What collectives across
        nodes run inside each node.

        Raises:
            as ``Group()``: on every rank of the node.
        """
        self._check_open()
        world = self.world
        # The same timeout, handle type and P2P choices as this group: the node's steps
        # must give up on a late peer when the group's own steps would.
        return Group(self.backend_name, self.exchange_name, comm=world.local_comm,
                     host_placement=(world.host_rank, world.host_size), **self._given)

    def barrier(self) -> None:
        """Collective, host-blocking: an MPI barrier over the group.

        Raises:
            PeerDied / ExchangeTimeout: a rank died or did not come in time.
            WindowError: the group is closed.
        """
        self._check_open()
        self.rendezvous.barrier("group barrier")

    def _forget(self, window: Window) -> None:
        with contextlib.suppress(ValueError):
            self._windows.remove(window)

    def note_failed_call(self) -> None:
        """A call of one of this group's communicators failed on this rank (a timeout, a
        dead peer, Ctrl-C). A peer may then have given up on an MPI collective that this
        rank never posted, and its message is still on the way: freeing the group's MPI
        communicators would let MPI reuse their context for a later one, where that
        message would be taken for a new call's data (seen: a later group's setup read
        another rank's bytes). So they are kept for the life of the process."""
        self._failed_call = True

    def forget_communicator(self, communicator: Any) -> None:
        """A communicator of this group closed: the group has nothing more to close of
        it (so a loop making and closing communicators holds none of them)."""
        with contextlib.suppress(ValueError):
            self._communicators.remove(communicator)

    def close(self) -> None:
        """Close every window, the exchange and the backend. Idempotent; collective."""
        if self._closed:
            return
        self._closed = True
        try:
            errors = []
            for communicator in reversed(list(self._communicators)):
                try:
                    communicator.close()
                except Exception as exc:  # close the rest anyway; report the first
                    errors.append(exc)
            self._communicators.clear()
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
                # A wait given up on (the watch failed) or a failed call: keep the MPI
                # communicators (note_failed_call says why).
                failed = self._failed_call or (self.watch is not None and
                                               bool(self.watch.failed))
                if self.watch is not None:
                    self.watch.close()
                self.world.close(keep=failed)

    def __enter__(self) -> Group:
        return self

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        # An error of this rank alone: close without waiting the whole timeout for peers
        # that are elsewhere, and let the user's error through (consensus.py).
        if self._closed or getattr(self, "rendezvous", None) is None:
            self.close()
        else:
            # The groups its open communicators close too (a node group across nodes)
            # get the same grace.
            inner = tuple(meeting for communicator in self._communicators
                          for meeting in communicator.inner_meetings())
            self.rendezvous.close_on_exit(error, self.close, "closing the group", inner=inner)

