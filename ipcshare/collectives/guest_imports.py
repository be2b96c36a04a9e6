"""A guest's own arrays, mapped by the leader of its time-sliced GPU, so that its stepped
calls on them cost no copy of its own (collectives/time_sliced.py).

A guest's copy into or out of its window is GPU work of its own context, so each costs a
hand-over of the GPU (about 140 µs on an H100, docs/GPU.md); a torch tensor from the
caching allocator is such an array in every call. So a guest hands the allocation behind
such an array to its leader once, and from then on names the array by the leader's
address of it; the leader's kernels stage its input and write its output there.

The hand-over never makes a call wait on another rank's host: the guest posts the
allocation's export (a legacy IPC handle, or a cuMem allocation's descriptor number for
the leader to take with pidfd_getfd) and goes on copying; the leader maps it at the start
of one of its own later calls and replies with its address; the guest uses that address
from the first call after the reply arrives (so from about the third call on the same
memory). Nothing is posted or mapped while the call's stream is being captured (mapping is
not allowed in a capture), so a graph captured before the reply keeps its copies.

An allocation is known by its buffer id (``CU_POINTER_ATTRIBUTE_BUFFER_ID``, unique for
the process's life), so memory freed and allocated again at the same address is never
taken for the old one. The guest tells its leader to unmap an allocation once it has gone
(a newer one overlaps it, or the buffer id at its base changed): freeing it waited for the
guest's streams, and each of those waited for the leader's kernels of its calls, so none
of them still reads it. At most ``IMPORT_CAPACITY`` allocations per guest are mapped; past
that, calls on further ones copy as before.

Messages travel by MPI on a duplicate of the group's communicator (user traffic on the
group's own cannot take them): ``("open", token, payload, fd number or -1)`` and
``("close", token)`` from a guest, ``("opened", token, address)`` and ``("refused", token,
reason)`` from its leader.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..runtime.logs import get_logger

__all__ = ["GuestImports", "ImportChannel", "LeaderImports", "IMPORT_CAPACITY"]

log = get_logger("collectives")

# Allocations of one guest its leader maps at once.
IMPORT_CAPACITY = 64
# Allocations remembered as refused (e.g. managed memory): dropped oldest first.
_REFUSED_KEPT = 256
_TAG = 0x1C5


class ImportChannel:
    """Point-to-point messages between the ranks of time-sliced GPUs, on a duplicate of
    the group's communicator (collective to make; ``close`` is idempotent)."""

    def __init__(self, comm: Any) -> None:
        from ..topology.world import mpi

        self._mpi = mpi()
        self._comm = comm.Dup()
        self._sends: list[Any] = []

    @classmethod
    def open(cls, group: Any) -> ImportChannel | None:
        """Collective over the group: a channel where a GPU of this single-node group is
        time-sliced (the same answer on every rank), else None."""
        if group.world.node_count != 1 or not group.time_sliced_gpus:
            return None
        return cls(group.world.comm)

    def post(self, rank: int, message: tuple) -> None:
        """Send ``message`` to ``rank`` without waiting for it to be received."""
        self._sends = [request for request in self._sends if not request.Test()]
        self._sends.append(self._comm.isend(message, dest=rank, tag=_TAG))

    def pending(self) -> bool:
        """Whether a message waits to be received (cheap: one probe)."""
        return bool(self._comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=_TAG))

    def receive(self) -> list[tuple[int, tuple]]:
        """Every message that has arrived, as (sender rank, message), in arrival order."""
        received = []
        status = self._mpi.Status()
        while self._comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=_TAG, status=status):
            source = status.Get_source()
            received.append((source, self._comm.recv(source=source, tag=_TAG)))
        return received

    def close(self) -> None:
        """Take what arrived and was never read, and free the communicator (idempotent;
        after the window's closing barrier, so the peers posted all they will)."""
        comm, self._comm = self._comm, None
        if comm is None or self._mpi.Is_finalized():
            return
        self._comm = comm  # receive() reads it
        try:
            self.receive()
            # Small messages leave eagerly; one still unsent goes with the communicator.
            self._sends = [request for request in self._sends if not request.Test()]
            comm.Free()
        except Exception as exc:
            # A peer that died leaves MPI unable to finish these; the group reports the
            # death itself, and nothing here holds memory or descriptors.
            log.debug("closing the guests' message channel: %s", exc)
        finally:
            self._comm = None
            self._sends.clear()


@dataclasses.dataclass
class _Allocation:
    token: int
    base: int
    size: int
    buffer_id: int
    leader_base: int | None = None  # None: no reply yet
    fd: Any = None                  # a cuMem export's descriptor, held until the reply

    def holds(self, ptr: int, nbytes: int) -> bool:
        return self.base <= ptr and ptr + nbytes <= self.base + self.size

    def overlaps(self, base: int, size: int) -> bool:
        return base < self.base + self.size and self.base < base + size

    def drop_fd(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            fd.close()


class GuestImports:
    """The guest's side: which of its allocations its leader maps, and where.

    ``buffer_id(ptr)``: the id of the allocation holding ``ptr`` (None: not device memory
    this process can name); ``address_range(ptr)``: that allocation's (base, size);
    ``export(base, size)``: its ``(payload, descriptor or None)`` (raises BackendError
    naming why it cannot be shared)."""

    def __init__(self, channel: Any, leader: int, *, buffer_id: Callable[[int], int | None],
                 address_range: Callable[[int], tuple[int, int]],
                 export: Callable[[int, int], tuple[bytes, Any]],
                 capacity: int = IMPORT_CAPACITY) -> None:
        self._channel, self._leader = channel, leader
        self._buffer_id, self._range, self._export = buffer_id, address_range, export
        self._capacity = capacity
        self._by_id: dict[int, _Allocation] = {}
        self._by_token: dict[int, _Allocation] = {}
        self._refused: dict[int, str] = {}  # buffer id -> why, oldest first
        self._next_token = 0
        self._waiting = 0                   # posted, no reply yet
        self._told_full = False

    @property
    def mapped(self) -> int:
        """Allocations the leader maps now (replied)."""
        return sum(1 for entry in self._by_id.values() if entry.leader_base is not None)

    def buffer_id(self, ptr: int) -> int | None:
        """The id of the allocation holding ``ptr`` now (a bound call checks that its
        arrays' allocations are still the ones mapped)."""
        return self._buffer_id(ptr)

    def settled(self) -> bool:
        """Whether every allocation handed over has its reply (taking those that came)."""
        if self._waiting:
            self._take_replies()
        return not self._waiting

    def address(self, ptr: int, nbytes: int, *, may_post: Callable[[], bool]) -> int | None:
        """The leader's address of ``nbytes`` at ``ptr`` in this process, or None (not
        mapped there yet: the call copies). Where the allocation is new and ``may_post()``
        (the stream is not being captured), hand it to the leader.

        Raises:
            CudaError: a driver query failed.
        """
        if self._waiting:
            self._take_replies()
        if nbytes <= 0:
            return None
        identity = self._buffer_id(ptr)
        if identity is None or identity in self._refused:
            return None
        entry = self._by_id.get(identity)
        if entry is not None:
            if entry.leader_base is None or not entry.holds(ptr, nbytes):
                return None
            return entry.leader_base + (ptr - entry.base)
        if may_post():
            self._post(ptr, identity)
        return None

    def _post(self, ptr: int, identity: int) -> None:
        from ..runtime.errors import BackendError

        base, size = self._range(ptr)
        for stale in [e for e in self._by_id.values() if e.overlaps(base, size)]:
            self._release(stale)  # allocations alive together never overlap
        if len(self._by_id) >= self._capacity:
            self._release_gone()
        if len(self._by_id) >= self._capacity:
            if not self._told_full:
                self._told_full = True
                log.info("rank's leader maps %d of its allocations already: calls on "
                         "further ones copy them (register the arrays, or use comm.empty())",
                         self._capacity)
            return
        try:
            payload, fd = self._export(base, size)
        except BackendError as exc:
            self._refuse(identity, str(exc))
            return
        token = self._next_token
        self._next_token += 1
        entry = _Allocation(token, base, size, identity, fd=fd)
        self._by_id[identity] = self._by_token[token] = entry
        self._waiting += 1
        self._channel.post(self._leader, ("open", token, payload,
                                          -1 if fd is None else fd.fileno()))

    def _refuse(self, identity: int, why: str) -> None:
        if len(self._refused) >= _REFUSED_KEPT:
            del self._refused[next(iter(self._refused))]
        self._refused[identity] = why
        log.info("calls on the allocation behind this array copy it: %s", why)

    def _release_gone(self) -> None:
        """Unmap allocations that no longer exist (their base names another buffer)."""
        for entry in list(self._by_id.values()):
            if self._buffer_id(entry.base) != entry.buffer_id:
                self._release(entry)

    def _release(self, entry: _Allocation) -> None:
        del self._by_id[entry.buffer_id]
        del self._by_token[entry.token]
        if entry.leader_base is None:
            self._waiting -= 1
        entry.drop_fd()
        self._channel.post(self._leader, ("close", entry.token))

    def _take_replies(self) -> None:
        for _source, message in self._channel.receive():
            kind, token, value = message
            entry = self._by_token.get(token)
            if entry is None:
                continue  # released before the reply came
            self._waiting -= 1
            entry.drop_fd()
            if kind == "opened":
                entry.leader_base = int(value)
            else:
                del self._by_id[entry.buffer_id]
                del self._by_token[token]
                self._refuse(entry.buffer_id, f"rank {self._leader} could not map it: {value}")

    def close(self) -> None:
        """Drop what is held (idempotent; the leader unmaps everything on its close)."""
        for entry in self._by_id.values():
            entry.drop_fd()
        self._by_id.clear()
        self._by_token.clear()
        self._waiting = 0


class LeaderImports:
    """The leader's side: the allocations its guests handed over, mapped here.

    ``open_allocation(payload, fd)``: map an export here (an object with ``ptr`` and
    ``close()``); ``fetch_fd(guest, number)``: take descriptor ``number`` of the guest's
    process (raises with the reason where it cannot)."""

    def __init__(self, channel: Any, *, open_allocation: Callable[[bytes, Any], Any],
                 fetch_fd: Callable[[int, int], Any]) -> None:
        self._channel = channel
        self._open, self._fetch_fd = open_allocation, fetch_fd
        self._mapped: dict[tuple[int, int], Any] = {}  # (guest, token) -> allocation

    @property
    def mapped(self) -> int:
        return len(self._mapped)

    def serve(self, may_map: Callable[[], bool]) -> None:
        """Map and unmap what guests asked for since the last call, and reply; nothing
        while ``may_map()`` is false (the call's stream is being captured)."""
        if not self._channel.pending() or not may_map():
            return
        for guest, message in self._channel.receive():
            if message[0] == "close":
                allocation = self._mapped.pop((guest, message[1]), None)
                if allocation is not None:
                    allocation.close()
                continue
            _kind, token, payload, fd_number = message
            try:
                fd = None if fd_number < 0 else self._fetch_fd(guest, fd_number)
                try:
                    allocation = self._open(payload, fd)
                finally:
                    if fd is not None:
                        fd.close()
            except Exception as exc:
                self._channel.post(guest, ("refused", token, str(exc)))
                continue
            self._mapped[(guest, token)] = allocation
            self._channel.post(guest, ("opened", token, allocation.ptr))

    def close(self) -> None:
        """Unmap every allocation (idempotent; after the node's ranks are done with them).

        Raises:
            Exception: the first unmap that failed (all are attempted).
        """
        first: BaseException | None = None
        mapped, self._mapped = self._mapped, {}
        for allocation in mapped.values():
            try:
                allocation.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first
