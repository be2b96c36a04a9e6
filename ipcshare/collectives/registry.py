"""Arrays the user registered with ``Communicator.register``: every rank's array mapped
on every rank of the node without a copy, peer mappings counted per allocation (two
arrays of one allocation map it once) and released on ``unregister`` or ``close``."""

from __future__ import annotations

import contextlib
import os
import struct
from typing import Any

from ..runtime.errors import CollectiveError
from ..runtime.owned_fd import OwnedFd
from .arrays import ArrayRef, describe_array

__all__ = ["Registration", "Registry"]

# Whether a descriptor comes with the export, the array's offset in what peers map, and
# its bytes; the backend's payload follows.
_ENVELOPE = struct.Struct("!BQQ")


class Registration:
    """One registered array: where each rank's array of this registration lies in this
    process (``buffer_ptrs``, indexed by rank, this rank's own included) and a buffer of
    it (``peer(rank)``). Registrations are numbered alike on every rank (they are made
    collectively, in the same order), so a call names a peer's input by that number.

    It holds the user's array, so its memory cannot be freed and reused while peers
    map it.
    """

    def __init__(self, index: int, ref: ArrayRef, buffers: dict[int, Any]) -> None:
        self.index = index
        self.ptr = ref.ptr
        self.nbytes = ref.nbytes
        self._source = ref.source
        self._buffers = buffers
        self.closed = False

    @property
    def buffer_ptrs(self) -> list[int]:
        """One address per rank (this rank's is the array's own)."""
        return [self._buffers[rank].ptr for rank in sorted(self._buffers)]

    def peer(self, rank: int) -> Any:
        """Rank ``rank``'s registered array as a buffer mapped here (its bytes).

        Raises:
            CollectiveError: unregistered, or no such rank.
        """
        if self.closed:
            raise CollectiveError("this array was unregistered")
        if rank not in self._buffers:
            raise CollectiveError(f"rank {rank!r} is not in this group of {len(self._buffers)}")
        return self._buffers[rank]

    def holds(self, ptr: int, nbytes: int) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` lies inside this rank's registered array."""
        return self.ptr <= ptr and ptr + nbytes <= self.ptr + self.nbytes

    def __repr__(self) -> str:
        state = "unregistered" if self.closed else f"{len(self._buffers)} ranks"
        return f"Registration({self.index}, 0x{self.ptr:x}, {self.nbytes} bytes, {state})"


class _Mapping:
    """A peer's exported allocation mapped here, and how many registrations use it."""

    __slots__ = ("allocation", "references")

    def __init__(self, allocation: Any) -> None:
        self.allocation = allocation
        self.references = 0


class Registry:
    """The registrations of one communicator over ``group``."""

    def __init__(self, group: Any, *, local_buffer: Any, path: Any) -> None:
        self.group = group
        # Makes a buffer of this rank's own array: ArrayRef -> Buffer.
        self._local_buffer = local_buffer
        # Told of each registration made and dropped (the GPU path keeps a device table
        # of them for its kernels), in the same order on every rank.
        self._path = path
        self._registrations: list[Registration] = []     # live, by index
        self._mapped: dict[tuple[int, bytes], _Mapping] = {}
        self._uses: dict[int, list[tuple[int, bytes]]] = {}  # index -> mapping keys
        self._next = 0

    def __len__(self) -> int:
        return len(self._registrations)

    @property
    def mappings(self) -> int:
        """Distinct peer allocations mapped for registrations right now."""
        return len(self._mapped)

    def find(self, ptr: int, nbytes: int) -> Registration | None:
        """The latest registration holding ``[ptr, ptr + nbytes)`` on this rank, if any
        (a handful live at a time: a scan is cheaper than an index)."""
        for registration in reversed(self._registrations):
            if registration.holds(ptr, nbytes):
                return registration
        return None

    def by_index(self, index: int) -> Registration:
        """The live registration numbered ``index`` (the same on every rank).

        Raises:
            KeyError: none is.
        """
        for registration in self._registrations:
            if registration.index == index:
                return registration
        raise KeyError(index)

    def register(self, array: Any, describe: Any) -> Registration:
        """Collective over the node: ``describe(array)`` (this rank's checks of it, an
        ArrayRef), export it, exchange, map every peer's. Fails together: every rank
        raises the same error naming the failing rank (its checks included).

        Raises:
            BackendError / CollectiveError / ExchangeError: on every rank.
        """
        group, world = self.group, self.group.world
        backend = group.backend
        with contextlib.ExitStack() as undo:
            with group.step("register"):
                ref = describe(array)
                exported, offset = backend.share_existing(ref.ptr, ref.nbytes)
                undo.callback(exported.close)
            envelope = _ENVELOPE.pack(exported.fd is not None, offset, ref.nbytes)
            payloads = group.exchange.share_bytes(envelope + exported.payload, kind=backend.name)
            fds: dict[int, OwnedFd] = {}
            carries_fd = any(payload[0] for payload in payloads.values())
            if carries_fd and world.local_size > 1:
                # Every rank of the node joins the descriptor exchange, with a throwaway
                # descriptor where its export has none (a legacy IPC handle).
                mine = exported.fd or undo.enter_context(
                    OwnedFd(os.memfd_create("ipcshare-none", os.MFD_CLOEXEC)))
                fds = group.exchange.share_fds(mine)
                for owned in fds.values():
                    undo.callback(owned.close)
            buffers: dict[int, Any] = {}
            keys: list[tuple[int, bytes]] = []
            with group.step("register import"):
                for rank, payload in sorted(payloads.items()):
                    has_fd, peer_offset, peer_nbytes = _ENVELOPE.unpack_from(payload)
                    if rank == world.rank:
                        buffers[rank] = self._local_buffer(ref)
                        continue
                    key = (rank, payload[_ENVELOPE.size:])
                    mapping = self._mapped.get(key)
                    if mapping is None:
                        allocation = backend.open_existing(key[1], fds.get(rank) if has_fd
                                                           else None)
                        mapping = self._mapped[key] = _Mapping(allocation)
                    mapping.references += 1
                    undo.callback(self._release, key)
                    keys.append(key)
                    buffers[rank] = mapping.allocation.buffer(peer_offset, peer_nbytes)
                registration = Registration(self._next, ref, buffers)
                self._path.registered(registration)
                undo.callback(self._path.unregistered, registration)
            undo.pop_all()
        for owned in fds.values():
            owned.close()
        exported.close()
        self._next += 1
        self._registrations.append(registration)
        self._uses[registration.index] = keys
        return registration

    def unregister(self, target: Any) -> None:
        """Collective over the node: drop ``target``, a ``Registration`` of this registry
        or an array (its latest registration, exactly that array), unmap the peer
        allocations no other registration uses, and wait until every rank has, so no
        peer maps the array once this returns.

        Raises:
            CollectiveError: ``target`` is not registered here, or not an array (on every
                rank, naming it).
        """
        group = self.group
        with group.step("unregister"):
            if isinstance(target, Registration):
                if target not in self._registrations:
                    state = "was unregistered" if target.closed else "is another communicator's"
                    raise CollectiveError(f"registration {target.index} {state}: pass a "
                                          "live Registration of this communicator")
                registration = target
            else:
                ref = describe_array(target, "array")
                found = [r for r in self._registrations
                         if (r.ptr, r.nbytes) == (ref.ptr, ref.nbytes)]
                if not found:
                    raise CollectiveError(f"{ref.spell()} at 0x{ref.ptr:x} is not registered "
                                          "with this communicator: pass the array given to "
                                          "register() or its Registration")
                registration = found[-1]
        self._drop(registration)
        group.wait_for_node("unregistering an array")

    def _drop(self, registration: Registration) -> None:
        self._path.unregistered(registration)
        registration.closed = True
        self._registrations.remove(registration)
        keys = self._uses.pop(registration.index)
        registration._buffers.clear()
        registration._source = None  # the user's array is theirs again
        first: BaseException | None = None
        for key in keys:
            try:
                self._release(key)
            except Exception as exc:  # release the others, then report
                first = first or exc
        if first is not None:
            raise first

    def _release(self, key: tuple[int, bytes]) -> None:
        mapping = self._mapped.get(key)
        if mapping is None:
            return
        mapping.references -= 1
        if mapping.references <= 0:
            del self._mapped[key]
            mapping.allocation.close()

    def close(self) -> None:
        """Drop every registration and unmap every peer allocation (idempotent; the
        caller waits for the node afterwards).

        Raises:
            BackendError / CudaError: an unmap failed (all are attempted).
        """
        first: BaseException | None = None
        for registration in list(self._registrations):
            try:
                self._drop(registration)
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first
